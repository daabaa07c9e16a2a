"""Memory of one GRPO-shaped decoding turn on SmolLM2-135M: 4 `fncall` prompts, 8 samples each
continuing the prompt's cache, 32 sampled tokens per sample (no stop), 1 thread. Prints and writes
(JSON) the process's peak RSS before and after the turn and what stays resident afterwards (the
32 returned row caches). A benchmark, not a test. To compare with another checkout, run this script
with ``PYTHONPATH=that/src`` in a separate process:

    python benchmarks/turn_memory.py --label this --out benchmarks/results/turn_memory.json
    PYTHONPATH=/tmp/old/src python benchmarks/turn_memory.py --label e9aee6c --out /tmp/old_turn_memory.json
"""

from __future__ import annotations

import argparse
import json
import resource
from pathlib import Path

import torch

from decode_speed import fncall_prompts


def resident_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--second", type=int, default=0,
                    help="then a second turn: every row continues its returned cache with this many observation "
                         "tokens (its prompt's last ones) and samples 8; its peak RSS and seconds are reported too")
    ap.add_argument("--label", default="this checkout")
    ap.add_argument("--out", default="benchmarks/results/turn_memory.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    import trajtune
    from trajtune.generation import CachedSampler
    from trajtune.models.loading import load_model, load_tokenizer

    model = load_model(a.model, dtype="float32", trainable=False)
    model.eval()
    prompts = fncall_prompts(load_tokenizer(a.model), a.prompts)
    sampler = CachedSampler(model, 1.0, 1.0, stop_ids=[])
    with torch.no_grad():
        done = sampler._prefill([(None, p[:-1]) for p in prompts])
    rows = [(cache, [p[-1]]) for (_, cache), p in zip(done, prompts) for _ in range(a.group)]
    before, resident = peak_mb(), resident_mb()
    out = sampler.turn(rows, [a.new] * len(rows), 0)
    result = {"benchmark": "turn_memory", "label": a.label, "trajtune_src": str(Path(trajtune.__file__).parent),
              "model": a.model, "rows": len(rows), "new_tokens": a.new,
              "peak_rss_mb_before": before, "peak_rss_mb_after": peak_mb(),
              "resident_mb_before": resident, "resident_mb_after": resident_mb(), "caches_returned": len(out)}
    if a.second:
        import time

        nxt = [(cache, [ids[-1]] + p[-a.second:]) for (ids, _, _, cache), p in
               zip(out, [p for p in prompts for _ in range(a.group)])]
        resident2, t0 = resident_mb(), time.perf_counter()
        sampler.turn(nxt, [8] * len(nxt), 1)
        result |= {"second_turn_s": time.perf_counter() - t0, "peak_rss_mb_after_second": peak_mb(),
                   "resident_mb_before_second": resident2}
        print(f"{a.label}: second turn ({a.second} observation tokens, 8 sampled) {result['second_turn_s']:.2f} s; "
              f"peak RSS after it {result['peak_rss_mb_after_second']:.0f} MB")
    print(f"{a.label}: {len(rows)} rows x {a.new} tokens; peak RSS {before:.0f} -> {result['peak_rss_mb_after']:.0f} MB "
          f"(+{result['peak_rss_mb_after'] - before:.0f}); resident after the turn, its caches held: "
          f"+{result['resident_mb_after'] - resident:.0f} MB")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
