"""Roofline helpers: express a benchmark's result as a fraction of this machine's measured limits.

``benchmarks/roofline.py`` measures the limits (fp32 matmul GFLOP/s at a model's layer shapes and
memory bandwidth, at 1 and 2 threads) into ``benchmarks/results/roofline.json``; other benchmarks
import this module (by path: ``benchmarks/`` is not a package) to say how far from them they are::

    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("_roofline", "benchmarks/_roofline.py")
    rl = importlib.util.module_from_spec(spec); sys.modules["_roofline"] = rl; spec.loader.exec_module(rl)
    limits = rl.load_limits()
    flops = rl.model_flops_per_token(model.config, seq_len=580, training=True) * tokens_per_s
    print(f"{rl.fraction(flops, limits, threads=2):.0%} of peak matmul")

FLOP counts follow the usual convention (Kaplan et al. 2020; PaLM's MFU, Chowdhery et al. 2022,
appendix B): a forward pass costs 2 FLOPs per matmul parameter per token (one multiply-add), plus
the attention scores and their weighted sum, 2·2·n_layers·ctx·d_attn per token; forward +
backward costs 3× the forward (the backward computes gradients of the activations and of the
weights, each as costly as the forward). Embedding lookups, norms, activations, softmax and
biases are left out (they are O(d) per token, not O(d²)).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEFAULT_PATH = Path(__file__).resolve().parent / "results" / "roofline.json"

#: SmolLM2-135M(-Instruct)'s shapes, as in its config.json (hard-coded so the benchmark needs no
#: download): hidden 576, intermediate 1536, vocab 49152, 30 layers, 9 heads of 64, 3 KV heads,
#: tied embeddings, gated (SiLU) MLP, no biases.
SMOLLM2_135M: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "vocab_size": 49152,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
    "tie_word_embeddings": True,
}


def _get(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def _dims(config: Any) -> dict[str, int]:
    h = int(_get(config, "hidden_size"))
    heads = int(_get(config, "num_attention_heads"))
    kv = int(_get(config, "num_key_value_heads") or heads)
    head_dim = int(_get(config, "head_dim") or h // heads)
    return {"h": h, "inter": int(_get(config, "intermediate_size")), "vocab": int(_get(config, "vocab_size")),
            "layers": int(_get(config, "num_hidden_layers")), "heads": heads, "kv": kv, "head_dim": head_dim}


def layer_shapes(config: Any) -> list[tuple[str, int, int]]:
    """(name, in_features K, out_features N) of each distinct matmul of a decoder layer, and the LM
    head: what one token costs 2·K·N FLOPs through. Assumes a gated MLP (Llama, Qwen, Mistral, SmolLM)."""
    d = _dims(config)
    q, kv = d["heads"] * d["head_dim"], d["kv"] * d["head_dim"]
    return [("q_proj", d["h"], q), ("k_proj/v_proj", d["h"], kv), ("o_proj", q, d["h"]),
            ("gate_proj/up_proj", d["h"], d["inter"]), ("down_proj", d["inter"], d["h"]),
            ("lm_head", d["h"], d["vocab"])]


def matmul_params(config: Any) -> int:
    """Weights a token is multiplied by: every layer's q, k, v, o, gate, up and down projections,
    plus the LM head (counted even when tied to the embeddings: the lookup is free, the head is not)."""
    d = _dims(config)
    q, kv = d["heads"] * d["head_dim"], d["kv"] * d["head_dim"]
    per_layer = d["h"] * q + 2 * d["h"] * kv + q * d["h"] + 3 * d["h"] * d["inter"]
    return d["layers"] * per_layer + d["h"] * d["vocab"]


def model_flops_per_token(config: Any, seq_len: int, training: bool, *, causal: bool = False) -> float:
    """FLOPs per token: 2·N (N = ``matmul_params``) + 4·n_layers·ctx·d_attn forward, ×3 with the
    backward (``training``). ``ctx`` is ``seq_len``, the keys each token attends to (PaLM's MFU
    convention, which counts the masked half of causal attention); ``causal`` uses the mean
    context of a causal sequence, (seq_len + 1) / 2. For decoding, pass the current context length."""
    d = _dims(config)
    ctx = (seq_len + 1) / 2 if causal else seq_len
    forward = 2 * matmul_params(config) + 4 * d["layers"] * ctx * d["heads"] * d["head_dim"]
    return 3 * forward if training else float(forward)


def load_limits(path: str | Path = DEFAULT_PATH) -> dict[str, Any]:
    """The measured peaks of ``roofline.json``: ``{threads: {"gflops": best matmul GFLOP/s over the
    shapes, "gflops_by_m": {M: best GFLOP/s at M tokens}, "read_gb_s", "copy_gb_s"}}`` (threads as int),
    plus ``"raw"``: the whole file."""
    data = json.loads(Path(path).read_text())
    out: dict[str, Any] = {int(t): v for t, v in data["peaks"].items()}
    for v in out.values():
        v["gflops_by_m"] = {int(m): g for m, g in v.get("gflops_by_m", {}).items()}
    out["raw"] = data
    return out


def _peak(limits: Mapping[Any, Any], threads: int) -> Mapping[str, Any]:
    if threads not in limits:
        have = sorted(k for k in limits if isinstance(k, int))
        raise KeyError(f"no roofline measured at {threads} thread(s); measured: {have}")
    return limits[threads]


def fraction(flops_per_s: float, limits: Mapping[Any, Any], threads: int, *, m: int | None = None) -> float:
    """``flops_per_s`` as a fraction of the peak matmul rate at ``threads`` (the best over all shapes,
    or at ``m`` tokens per matmul: a batch-1 decode step is M = 1, far below the large-M peak)."""
    p = _peak(limits, threads)
    peak = p["gflops_by_m"][m] if m is not None else p["gflops"]
    return flops_per_s / (peak * 1e9)


def decode_bandwidth_fraction(weight_bytes: float, tokens_per_s: float, limits: Mapping[Any, Any], threads: int,
                              *, batch: int = 1) -> float:
    """Memory-bound decoding: each step reads every weight once, for ``batch`` tokens. The bytes read
    per second, weight_bytes · tokens_per_s / batch, as a fraction of the measured read bandwidth."""
    return weight_bytes * tokens_per_s / batch / (_peak(limits, threads)["read_gb_s"] * 1e9)


def head_params(config: Any) -> int:
    """The LM head's weights (hidden × vocab): its share of ``matmul_params``."""
    d = _dims(config)
    return d["h"] * d["vocab"]


def sequence_flops(config: Any, n: int, training: bool, *, head: int | None = None) -> float:
    """FLOPs of one causal sequence of ``n`` tokens through the model (each token attends to those
    before it and itself): ``n`` × ``model_flops_per_token`` at the mean causal context. ``head``:
    the positions the LM head runs at, when not every one (the convention's default): training
    needs logits only where a token is trained, sampling only after the last token, and trajtune
    computes no others (``logits_to_keep``); its weights are 21 % of SmolLM2-135M's matmuls."""
    if n <= 0:
        return 0.0
    total = n * model_flops_per_token(config, n, training, causal=True)
    if head is not None:
        total += (head - n) * (3 if training else 1) * 2 * head_params(config)
    return total


def continuation_flops(config: Any, cached: int, new: int, training: bool = False, *, head: int | None = None) -> float:
    """FLOPs of ``new`` tokens encoded or sampled after ``cached`` tokens whose keys and values are
    kept: the sequence of ``cached + new`` tokens less its first ``cached`` ones (what a KV cache
    saves), with the LM head at ``head`` of the new positions (default: all)."""
    body = sequence_flops(config, cached + new, training, head=0) - sequence_flops(config, cached, training, head=0)
    return body + (new if head is None else head) * (3 if training else 1) * 2 * head_params(config)


def trained_tokens(row: Any) -> int:
    """Positions of a ``TokenTrajectory`` whose logits the SFT loss uses (``Batch.loss_mask``: policy
    tokens of weight > 0): where trajtune's learner runs the LM head."""
    from trajtune.tokens import SOURCE_POLICY

    return sum(1 for s, w in zip(row.source, row.weight) if s == SOURCE_POLICY and w > 0)


def rate(flops: float, seconds: float, limits: Mapping[Any, Any] | None, threads: int,
         *, m: int | None = None) -> dict[str, float | None]:
    """``{"gflops": model GFLOP/s, "matmul_fraction": of the peak at threads (None without limits
    measured at that thread count)}``: the two columns a speed table adds."""
    gflops = flops / seconds / 1e9
    ok = limits is not None and threads in limits and (m is None or m in limits[threads]["gflops_by_m"])
    return {"gflops": gflops, "matmul_fraction": fraction(gflops * 1e9, limits, threads, m=m) if ok else None}


def add_roofline_arg(ap: Any) -> None:
    """The ``--roofline`` option every speed benchmark takes (read with ``limits_or_none``)."""
    ap.add_argument("--roofline", default=None,
                    help="the limits to divide by (default benchmarks/results/roofline.json): measure them the same "
                         "day, on the same machine, with benchmarks/roofline.py --out")


def recorded_peaks(limits: Mapping[str, Any] | None) -> Any:
    """What a benchmark's JSON keeps of the limits it divided by: their peaks, or None without limits."""
    return limits["raw"].get("peaks") if limits else None


def limits_or_none(path: str | Path | None = None) -> dict[str, Any] | None:
    """``load_limits`` of ``path`` (default ``roofline.json``), or None with a note when the file is
    missing: a speed benchmark still prints its times, without the fraction columns."""
    p = Path(path) if path else DEFAULT_PATH
    if not p.exists():
        print(f"(no roofline at {p}: run benchmarks/roofline.py --out {p} for the fraction columns)")
        return None
    return load_limits(p)


def pct(x: float | None) -> str:
    """A fraction as a table cell (``46%``), or ``-`` when there is none."""
    return "-" if x is None else f"{x:.0%}"
