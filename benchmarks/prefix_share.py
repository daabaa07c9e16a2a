"""Shared-prefix training: forward + backward of a GRPO-like micro-batch (or a DPO pair) with train.share_prefix on vs off.

The micro-batch is G rows sharing one prompt (random tokens) with short completions, the shape of
a GRPO group; the loss is the clipped policy-gradient surrogate (``PolicyGradientObjective``).
``--objective dpo``: the rows are (chosen, rejected) pairs of that prompt, and a step is what a DPO
step computes: the reference log-probs (a no-grad forward of the same weights, shared or not like
the policy's) plus the DPO loss's forward and backward.
Runs are interleaved (off, on, off, on, ...) on one thread, after a warm-up of each; min and
median seconds are reported, and each setting's model GFLOP/s at its median: the FLOPs it computes
(off: every row's whole sequence; on: the prompt once and each completion after it; the LM head at
the completions only; ``_roofline.sequence_flops`` and ``continuation_flops``; forward and
backward, plus DPO's reference forward) as a fraction of this machine's matmul peak
(``benchmarks/roofline.py``). Prints a table and writes JSON. A benchmark, not a test: never asserted.

    python benchmarks/prefix_share.py                        # the demo-size tiny model (micro preset)
    python benchmarks/prefix_share.py --model smollm2-135m   # SmolLM2-135M (cached locally)
    python benchmarks/prefix_share.py --model smollm2-135m --objective dpo --rows 2 --threads 2
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from _roofline import (add_roofline_arg, continuation_flops, limits_or_none, pct,
                       rate, recorded_peaks, sequence_flops)


def tiny_model(preset: str, vocab: int, max_len: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trajtune.models.tiny import PRESETS

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, max_position_embeddings=max_len, tie_word_embeddings=True,
                      rope_theta=10000.0, **PRESETS[preset])
    return Qwen2ForCausalLM(cfg)


def micro_batch(vocab: int, rows: int, prompt: int, completion: int, seed: int = 0):
    from trajtune.tokens import SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory

    g = torch.Generator().manual_seed(seed)
    p = torch.randint(1, vocab, (prompt,), generator=g).tolist()
    tts = []
    for k in range(rows):
        n = completion - 4 * (k % 3)  # a little spread in completion length
        c = torch.randint(1, vocab, (n,), generator=g).tolist()
        lp = [0.0] * prompt + [-1.0] * n
        tts.append(TokenTrajectory(ids=p + c, source=[SOURCE_PROMPT] * prompt + [SOURCE_POLICY] * n,
                                   turn=[0] * (prompt + n), weight=[1.0] * (prompt + n), logprobs=lp,
                                   advantages=[0.0] * prompt + [(-1.0) ** k] * n, group="g"))
    return tts


def step_seconds(model, objective, tts, share: bool) -> float:
    from trajtune.algorithms.batch import collate

    from trajtune.algorithms.batch import token_logprobs
    from trajtune.algorithms.dpo import DPOObjective

    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    batch = collate(tts, 0, share_prefix=share)
    if isinstance(objective, DPOObjective):  # the reference forward a DPO step runs (here: the same weights)
        with torch.no_grad():
            ref, _ = token_logprobs(model, batch)
        batch.ref_logprobs = torch.cat([ref.new_zeros(ref.shape[0], 1), ref], 1)
    loss, _ = objective.loss_sum(model, batch)
    loss.backward()
    return time.perf_counter() - t0


def work_flops(config, tts, prompt: int, share: bool, dpo: bool) -> float:
    """The FLOPs a step computes: forward + backward of the rows (the prompt once when shared), and
    for DPO the reference's forward of the same tokens."""
    def f(training: bool) -> float:  # the LM head at the completions' tokens only, as the objectives compute it
        if not share:
            return sum(sequence_flops(config, len(t.ids), training, head=len(t.ids) - prompt) for t in tts)
        return sequence_flops(config, prompt, training, head=0) + sum(
            continuation_flops(config, prompt, len(t.ids) - prompt, training) for t in tts)
    return f(True) + (f(False) if dpo else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="tiny (the demo's micro preset, random weights) or a "
                                                    "trajtune model alias such as smollm2-135m")
    ap.add_argument("--preset", default="micro", help="tiny-model preset")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=500)
    ap.add_argument("--completion", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=10, help="timed runs of each setting")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--objective", choices=["pg", "dpo"], default="pg",
                    help="pg: a GRPO group's policy-gradient loss; dpo: (chosen, rejected) pairs with reference log-probs")
    add_roofline_arg(ap)
    ap.add_argument("--out", default=None,
                    help="JSON path (default benchmarks/results/prefix_share[_dpo][_MODEL].json)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    from trajtune.algorithms.dpo import DPOObjective
    from trajtune.algorithms.policy_gradient import PolicyGradientObjective

    if a.model == "tiny":
        vocab = 1024
        model = tiny_model(a.preset, vocab, a.prompt + a.completion + 8)
        name = f"tiny-{a.preset}"
    else:
        from trajtune.models.loading import load_model

        model = load_model(a.model, dtype="float32")
        vocab = int(model.config.vocab_size)
        name = a.model
    model.train()
    params = sum(p.numel() for p in model.parameters())
    tts = micro_batch(vocab, a.rows, a.prompt, a.completion)
    if a.objective == "dpo" and a.rows % 2:
        raise SystemExit("--objective dpo needs an even --rows (chosen, rejected pairs)")
    objective = PolicyGradientObjective() if a.objective == "pg" else DPOObjective()

    for share in (False, True):  # warm-up
        step_seconds(model, objective, tts, share)
    times: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(a.repeats):  # interleaved: A B A B
        times["off"].append(step_seconds(model, objective, tts, False))
        times["on"].append(step_seconds(model, objective, tts, True))

    limits = limits_or_none(a.roofline)
    rows = {k: {"min_s": min(v), "median_s": statistics.median(v), "runs": v,
                **rate(work_flops(model.config, tts, a.prompt, k == "on", a.objective == "dpo"), statistics.median(v),
                       limits, a.threads)} for k, v in times.items()}
    speedup_min = rows["off"]["min_s"] / rows["on"]["min_s"]
    speedup_med = rows["off"]["median_s"] / rows["on"]["median_s"]
    print(f"model {name} ({params / 1e6:.1f}M params), objective {a.objective}, {a.rows} rows × ({a.prompt} prompt + ~{a.completion} "
          f"completion tokens), forward + backward, {a.threads} thread(s), {a.repeats} interleaved runs each")
    print(f"{'share_prefix':<14}{'min s':>10}{'median s':>11}{'GFLOP/s':>10}{'÷ peak':>8}")
    for k in ("off", "on"):
        print(f"{k:<14}{rows[k]['min_s']:>10.4f}{rows[k]['median_s']:>11.4f}{rows[k]['gflops']:>10.1f}"
              f"{pct(rows[k]['matmul_fraction']):>8}")
    print(f"{'speed-up':<14}{speedup_min:>9.2f}×{speedup_med:>10.2f}×")

    stem = "prefix_share" + ("_dpo" if a.objective == "dpo" else "")
    out = Path(a.out) if a.out else Path(__file__).parent / "results" / (
        f"{stem}.json" if a.model == "tiny" else f"{stem}_{a.model}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "prefix_share", "objective": a.objective, "model": name, "parameters": params, "rows": a.rows, "prompt_tokens": a.prompt,
        "completion_tokens": a.completion, "threads": a.threads, "repeats": a.repeats,
        "torch": torch.__version__, "machine": platform.machine(), "processor": platform.processor(),
        "roofline": recorded_peaks(limits), "results": rows, "speedup_min": speedup_min,
        "speedup_median": speedup_med,
    }, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
