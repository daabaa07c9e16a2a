"""Real-model decoding speed against the roofline: SmolLM2-135M's cached sampler on `fncall` prompts
at batch 1, 8 and 32, in tokens/s and as a fraction of this machine's limits (roofline.json).

The prompts are encoded once per batch size (``prefill s``, the first repeat's time). Each repeat,
interleaved across batch sizes, then continues every row from its cache twice: sampling 1 token and
``--new`` tokens (no stop token, so every row samples all of them); decoding tokens/s is
batch · (new − 1) / (t_full − t_one), min over repeats. (Subtracting a whole prefill instead, tens of
seconds at batch 32, left the few seconds of decoding inside its noise.) Reported beside it:
model FLOPs per second (2·N + attention at the mean context, ``_roofline.model_flops_per_token``)
÷ the measured matmul peak at M = batch, and for batch 1 the weight bytes read per second ÷ the read
bandwidth. ``--profile`` prints torch's operator profile of decoding ``--new`` tokens at the largest batch.
``--group N``: every prompt is continued by N rows from one cache (a GRPO group's first turn), and
each batch is decoded both ways, interleaved: ``padded`` (every row attends to its own copy of the
prompt's cache, ``share_prompt=False``) and ``shared`` (one copy per prompt, cascade attention,
``trajtune.shared_prompt``). Prints a table and writes JSON. A benchmark, not a test.

    python benchmarks/roofline.py                 # once: this machine's limits
    python benchmarks/decode_speed.py --threads 2 --repeats 3 --profile
    python benchmarks/decode_speed.py --threads 1 --repeats 3 --group 8 --batches 8 32 --out benchmarks/results/decode_speed_group8.json
    python benchmarks/decode_speed.py --threads 1 --group 8 --batches 32 --baseline-src /tmp/old/src --matmul-chain

``--baseline-src`` times another checkout's sampler beside this one's in the same process (interleaved,
same caches); ``--matmul-chain`` times the model's linear layers alone, in forward order, at each batch:
what decoding would reach if everything but those matmuls were free.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from _roofline import (add_roofline_arg, decode_bandwidth_fraction, fraction, load_limits,
                       model_flops_per_token)


def fncall_prompts(tok: object, n: int) -> list[list[int]]:
    """``n`` distinct `fncall` first prompts (system prompt, tool schemas, request) as token ids."""
    from trajtune.chat.render import ChatRenderer
    from trajtune.envs.registry import make_env

    renderer = ChatRenderer(tok)
    env = make_env("fncall", single_turn=True)
    out = []
    for task in env.tasks("train", n, seed=0):
        res = make_env("fncall", single_turn=True).reset(task)
        out.append(renderer.prompt_ids(res.messages, res.tools))
    return out


def add_common_args(ap: argparse.ArgumentParser, threads: int) -> None:
    ap.add_argument("--model", default="smollm2-135m")
    add_roofline_arg(ap)
    ap.add_argument("--threads", type=int, default=threads)


def setup(a: argparse.Namespace, n_prompts: int) -> tuple[Any, dict[str, Any], list[list[int]], Any]:
    """The model in eval mode, the roofline limits, ``n_prompts`` fncall prompts and a cached sampler
    with no stop token (every row samples all the tokens it is given room for)."""
    torch.set_num_threads(a.threads)
    from trajtune.generation import CachedSampler
    from trajtune.models.loading import load_model, load_tokenizer

    model = load_model(a.model, dtype="float32", trainable=False)
    model.eval()
    limits = load_limits(a.roofline) if a.roofline else load_limits()
    prompts = fncall_prompts(load_tokenizer(a.model), n_prompts)
    return model, limits, prompts, CachedSampler(model, 1.0, 1.0, stop_ids=[])


def turn_seconds(sampler: object, prompts: list[list[int]], new: int, seed: int) -> float:
    return continue_seconds(sampler, [(None, p) for p in prompts], new, seed)


def continue_seconds(sampler: object, rows: list[tuple[object, list[int]]], new: int, seed: int) -> float:
    t0 = time.perf_counter()
    sampler.turn(rows, [new] * len(rows), seed)  # type: ignore[attr-defined]
    return time.perf_counter() - t0


def matmul_chain_gflops(model: Any, m: int, repeats: int) -> float:
    """The model's own linear layers alone, in forward order, on random inputs of ``m`` rows: the best
    GFLOP/s over ``repeats``. Their weights (0.5 GB for SmolLM2-135M) are read from memory as in a
    decoding step, where the roofline's matmul peak multiplies one small weight kept in cache; so
    this is the most that decoding at batch ``m`` could reach if attention, norms, sampling and
    Python cost nothing."""
    linears = [mod for mod in model.modules() if isinstance(mod, torch.nn.Linear)]
    inputs = {k: torch.randn(m, k) for k in {lin.in_features for lin in linears}}
    flops = 2 * m * sum(lin.in_features * lin.out_features for lin in linears)
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats + 1):  # the first pass warms up
            t0 = time.perf_counter()
            for lin in linears:
                torch.nn.functional.linear(inputs[lin.in_features], lin.weight)
            best = min(best, time.perf_counter() - t0)
    return flops / best / 1e9


def baseline_modules(src: str) -> tuple[Any, Any]:
    """Another checkout's ``trajtune.generation`` and ``trajtune.shared_prompt`` (``src``: its src/
    directory), imported beside this checkout's, whose modules stay the ones ``import trajtune``
    gives. Both versions then decode in one process, turn by turn on the same model and caches:
    separate processes differed by up to 15 % from one another on this machine, more than a few per
    cent of change could show through."""
    import importlib
    import sys

    import trajtune.generation  # noqa: F401  (ours, imported before theirs replace them for a moment)

    def ours() -> dict[str, Any]:
        return {k: v for k, v in sys.modules.items() if k == "trajtune" or k.startswith("trajtune.")}

    kept = ours()
    for k in kept:
        del sys.modules[k]
    sys.path.insert(0, src)
    try:
        gen, sp = importlib.import_module("trajtune.generation"), importlib.import_module("trajtune.shared_prompt")
    finally:
        sys.path.remove(src)
        for k in ours():
            del sys.modules[k]
        sys.modules.update(kept)
    return gen, sp


def use_attention(shared_prompt_module: Any) -> None:
    """Register that version's shared-prompt attention (both register under one name)."""
    from transformers import AttentionInterface

    AttentionInterface.register(shared_prompt_module.NAME, shared_prompt_module.shared_prompt_attention)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, threads=2)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--new", type=int, default=32, help="tokens sampled per row")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="print the operator profile at the largest batch")
    ap.add_argument("--group", type=int, default=1,
                    help="rows per prompt, continuing one cache; above 1 both layouts (padded, shared) are timed")
    ap.add_argument("--layouts", nargs="+", choices=["padded", "shared"], default=["padded", "shared"],
                    help="with --group above 1, the layouts to time (e.g. only 'shared')")
    ap.add_argument("--baseline-src", default=None,
                    help="another checkout's src/ (e.g. a git worktree of an older commit): its sampler decodes the "
                         "same caches in this process, interleaved, as extra layouts named '... (baseline)'")
    ap.add_argument("--matmul-chain", action="store_true",
                    help="also time the model's linear layers alone at each batch (the ceiling for decoding)")
    ap.add_argument("--out", default="benchmarks/results/decode_speed.json")
    a = ap.parse_args()
    if any(b % a.group for b in a.batches):
        ap.error(f"every batch must be a multiple of --group {a.group}")
    model, limits, prompts, sampler = setup(a, max(a.batches) // a.group)
    layouts = {"padded": sampler}
    if a.group > 1:
        from trajtune.generation import CachedSampler

        layouts = {lay: CachedSampler(model, 1.0, 1.0, stop_ids=[], share_prompt=lay == "shared")
                   for lay in a.layouts}
    import trajtune.shared_prompt as ours

    attention = {lay: ours for lay in layouts}
    if a.baseline_src:
        base_gen, base_sp = baseline_modules(a.baseline_src)
        for lay in list(layouts):
            kw = {"share_prompt": lay == "shared"} if a.group > 1 else {}
            layouts[f"{lay} (baseline)"] = base_gen.CachedSampler(model, 1.0, 1.0, stop_ids=[], **kw)
            attention[f"{lay} (baseline)"] = base_sp
    use_attention(ours)
    turn_seconds(sampler, prompts[:2], 4, 0)  # warm-up
    arms = [(b, lay) for b in a.batches for lay in layouts]
    times: dict[tuple[int, str], dict[str, list[float]]] = {arm: {"prefill": [], "one": [], "full": []} for arm in arms}
    cached: dict[int, list[tuple[object, list[int]]]] = {}
    for b in a.batches:  # each row continues from its cache of all but the prompt's last token
        t0 = time.perf_counter()
        with torch.no_grad():
            done = sampler._prefill([(None, p[:-1]) for p in prompts[:b // a.group]])
        for lay in layouts:
            times[(b, lay)]["prefill"].append(time.perf_counter() - t0)
        cached[b] = [(cache, [p[-1]]) for (_, cache), p in zip(done, prompts[:b // a.group]) for _ in range(a.group)]
    for rep in range(a.repeats):
        for b, lay in arms:
            use_attention(attention[lay])
            times[(b, lay)]["one"].append(continue_seconds(layouts[lay], cached[b], 1, rep))
            times[(b, lay)]["full"].append(continue_seconds(layouts[lay], cached[b], a.new, rep))
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    rows = []
    used = [p for p in prompts[:max(a.batches) // a.group]]
    print(f"{a.model}: fncall prompts (mean {sum(map(len, used)) / len(used):.0f} tokens), {a.group} row(s) per "
          f"prompt, {a.new} new tokens per row, {a.threads} threads, min of {a.repeats}")
    print(f"{'batch':>5} {'layout':>18} {'prefill s':>10} {'decode s':>8} {'decode tok/s':>13} {'GFLOP/s':>8} "
          f"{'÷ matmul peak':>14} {'÷ read bandwidth':>17}")
    for b, lay in arms:
        t = times[(b, lay)]
        pre, full = min(t["prefill"]), min(t["full"])
        tps = b * (a.new - 1) / (full - min(t["one"]))
        ctx = sum(len(p) for p in prompts[:b // a.group]) / (b // a.group) + a.new / 2
        gflops = tps * model_flops_per_token(model.config, int(ctx), training=False) / 1e9
        row = {"batch": b, "layout": lay, "prefill_s": pre, "decode_turn_s": full, "decode_tokens_per_s": tps,
               "gflops": gflops,
               "matmul_fraction": fraction(gflops * 1e9, limits, a.threads, m=b if b in (1, 8, 32) else None),
               "bandwidth_fraction": decode_bandwidth_fraction(weight_bytes, tps, limits, a.threads, batch=b),
               "runs": t}
        rows.append(row)
        print(f"{b:5d} {lay:>18} {pre:10.2f} {full:8.2f} {tps:13.1f} {gflops:8.1f} {row['matmul_fraction']:14.0%} "
              f"{row['bandwidth_fraction']:17.0%}")
    chain: dict[int, float] = {}
    if a.matmul_chain:
        for b in a.batches:
            chain[b] = matmul_chain_gflops(model, b, max(a.repeats, 5))
            print(f"batch {b}: the model's linear layers alone, in order, {chain[b]:.1f} GFLOP/s = "
                  f"{fraction(chain[b] * 1e9, limits, a.threads, m=b if b in (1, 8, 32) else None):.0%} of the matmul "
                  f"peak at M = {b}")
    profile = None
    if a.profile:
        from torch.profiler import ProfilerActivity, profile as torch_profile

        last = [lay for lay in layouts if "baseline" not in lay][-1]
        use_attention(ours)
        with torch_profile(activities=[ProfilerActivity.CPU]) as p:
            continue_seconds(layouts[last], cached[max(a.batches)], a.new, 99)
        profile = p.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
        print(profile)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"benchmark": "decode_speed", "model": a.model, "threads": a.threads,
                                       "new_tokens": a.new, "repeats": a.repeats, "group": a.group,
                                       "baseline_src": a.baseline_src,
                                       "torch": torch.__version__,
                                       "rows": rows, "matmul_chain_gflops": chain, "profile": profile},
                                      indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
