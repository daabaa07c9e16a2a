"""Real-model prefill speed by pass size: how many rows the cached sampler encodes per forward pass.

The cached sampler (``trajtune.generation.CachedSampler``) encodes each row's new tokens after its
cache. Rows of one pass are padded to the longest new segment, and on a CPU the padding is not
free: the elementwise work (norms, rotary, SiLU, residual adds) and the masked attention run over
all of it, and the activations of a long padded batch no longer fit in cache. So the sampler groups
rows by length under a token budget (``generation.PREFILL_TOKENS``: rows × longest new segment).
This benchmark times, for several budgets, interleaved (budget A, B, … per repeat):

- ``first turn``: ``--rows`` distinct `fncall` first prompts (system prompt, tool schemas, request),
  one sampled token, through ``CachedSampler.turn`` (the prefix all prompts share encoded once);
- ``next turn``: the same rows continuing from their caches with ``--obs`` new tokens each (an
  observation and the next generation prompt), what every later turn of a multi-turn episode costs.

A budget of 0 means one pass for all rows (the sampler before grouping). Reports seconds (min and
median), tokens/s and model GFLOP/s (the work as the sampler does it: the shared prefix once, the LM
head at each row's last position only; ``work_flops``) as a fraction of the measured matmul peak
(roofline.json). Before 2026-12-07 the GFLOP/s counted the LM head at every token, as the usual
convention does, and a first turn's shared prefix once per prompt, neither of which the sampler
computes: 1.2 times too high for these prompts.
Prints a table and writes JSON. A benchmark, not a test.

    python benchmarks/prefill_speed.py --threads 1 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from _roofline import continuation_flops, fraction, sequence_flops
from decode_speed import add_common_args, setup


def work_flops(config: object, prompts: list[list[int]], obs: int) -> dict[str, float]:
    """The FLOPs each case needs, as the sampler computes them: the LM head only at each row's last
    position (``logits_to_keep``); a first turn encodes the prefix all prompts share once (the
    sampler's own ``shared_prompt_prefix``), then each prompt's rest; a next turn encodes
    ``obs`` tokens after each row's cached prompt."""
    from trajtune.generation import shared_prompt_prefix

    p = shared_prompt_prefix(prompts)
    first = sequence_flops(config, p, training=False, head=1 if p else 0) + sum(
        continuation_flops(config, p, len(x) - p, head=1) for x in prompts)
    return {"first turn": first, "next turn": sum(continuation_flops(config, len(x), obs, head=1) for x in prompts)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, threads=1)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--obs", type=int, default=24, help="new tokens per row in the next-turn case")
    ap.add_argument("--budgets", type=int, nargs="+", default=[0, 1024, 512, 256, 1],
                    help="tokens per pass; 0 = all rows in one pass, 1 = one row per pass")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/prefill_speed.json")
    a = ap.parse_args()
    from trajtune import generation

    model, limits, prompts, sampler = setup(a, a.rows)
    big = 1 << 30
    with torch.no_grad():
        sampler.prefill_tokens = 1
        caches = [res[1] for res in sampler._prefill([(None, p) for p in prompts])]
    g = torch.Generator().manual_seed(0)
    obs = [torch.randint(1000, 20000, (a.obs,), generator=g).tolist() for _ in prompts]

    first_rows, next_rows = [(None, p) for p in prompts], list(zip(caches, obs))

    def first_turn() -> None:  # through turn(), as a real first turn, shared-prefix step included
        sampler.turn(first_rows, [1] * len(prompts), 0)

    def next_turn() -> None:
        with torch.no_grad():
            sampler._prefill(next_rows)

    one_pass = sampler._prefill_pass
    n_passes = 0

    def counted_pass(items: list) -> list:
        nonlocal n_passes
        n_passes += 1
        return one_pass(items)

    sampler._prefill_pass = counted_pass  # type: ignore[method-assign]
    cases = {"first turn": first_turn, "next turn": next_turn}
    times: dict[str, dict[int, list[float]]] = {c: {b: [] for b in a.budgets} for c in cases}
    passes: dict[tuple[str, int], int] = {}
    for rep in range(a.repeats):
        for case, fn in cases.items():
            for b in a.budgets:
                sampler.prefill_tokens = b or big
                n_passes = 0
                t0 = time.perf_counter()
                fn()
                times[case][b].append(time.perf_counter() - t0)
                passes[case, b] = n_passes
    new_tokens = {"first turn": sum(map(len, prompts)), "next turn": a.obs * len(prompts)}
    flops = work_flops(model.config, prompts, a.obs)
    lens = sorted(map(len, prompts))
    print(f"{a.model}: {a.rows} distinct fncall prompts of {lens[0]}/{lens[len(lens) // 2]}/{lens[-1]} tokens "
          f"(min/median/max); next turn: {a.obs} new tokens per row; {a.threads} thread(s), {a.repeats} repeats")
    print(f"{'case':<11} {'budget':>7} {'min s':>8} {'median s':>9} {'tokens/s':>9} {'GFLOP/s':>8} {'÷ peak':>7} {'passes':>7}")
    rows = []
    for case in cases:
        for b in a.budgets:
            best, med = min(times[case][b]), statistics.median(times[case][b])
            tps = new_tokens[case] / best
            gflops = flops[case] / best / 1e9
            row = {"case": case, "budget": b, "min_s": best, "median_s": med, "tokens_per_s": tps,
                   "gflops": gflops, "matmul_fraction": fraction(gflops * 1e9, limits, a.threads),
                   "passes": passes[case, b], "runs": times[case][b]}
            rows.append(row)
            label = "all" if b == 0 else str(b)
            print(f"{case:<11} {label:>7} {best:8.2f} {med:9.2f} {tps:9.0f} {gflops:8.1f} "
                  f"{row['matmul_fraction']:7.0%} {passes[case, b]:7d}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"benchmark": "prefill_speed", "model": a.model, "threads": a.threads,
                                       "rows": a.rows, "obs": a.obs, "repeats": a.repeats,
                                       "prompt_lengths": lens, "torch": torch.__version__,
                                       "default_budget": generation.PREFILL_TOKENS, "results": rows},
                                      indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
