"""Peak RSS of trajtune's SFT step with the chunked LM head (train.loss_chunk_tokens) on and off.

Runs `benchmarks/vs_trl.py`'s trajtune worker (the same rows, model, batches and learner settings
as the TRL comparison in docs/speed.md, so the numbers read against TRL's there), one process per
configuration: gradient checkpointing off and on, each with `loss_chunk_tokens` 0 (off: the
model's logits all at once) and `auto`. Reported per configuration: peak RSS, which phase set it
(the peak before and after each optimizer step), the first step's loss (equal with chunking on and
off) and tokens/s (2 timed steps: a rough figure, not a timing benchmark). Writes JSON.

Peak RSS under glibc's allocator moves by up to ~0.3 GB between runs of the very same code (freed
memory it keeps, which varies with thread timing). `--fixed-mmap-threshold` runs the workers with
`MALLOC_MMAP_THRESHOLD_=131072`, so every tensor above 128 KiB is mapped and returned on free and
the peak RSS follows the live memory (reproducible, slower: compare memory only).

    python benchmarks/sft_memory.py --model smollm2-135m --steps 2 --batch 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("vs_trl.py")


def measure(a: argparse.Namespace, gc: bool, chunk: str) -> dict[str, Any]:
    cmd = [sys.executable, str(WORKER), "--worker", "trajtune", "--model", a.model, "--steps", str(a.steps),
           "--batch", str(a.batch), "--max-length", str(a.max_length), "--threads", str(a.threads),
           "--loss-chunk-tokens", chunk] + (["--gc"] if gc else [])
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072") if a.fixed_mmap_threshold else None
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"gc {gc}, loss_chunk_tokens {chunk} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def peak_phase(trace: list[tuple[str, float]]) -> str:
    """The phase during which the peak RSS last grew by more than 1 %."""
    last, phase = 0.0, "start-up"
    for name, gb in trace:
        if gb > last * 1.01:
            phase = name
        last = max(last, gb)
    return phase


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per run (after one warm-up step)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=640)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--fixed-mmap-threshold", action="store_true",
                    help="peak RSS that follows the live memory (see above)")
    ap.add_argument("--out", default="benchmarks/results/sft_memory.json")
    a = ap.parse_args()
    rows = []
    for gc in (False, True):
        for chunk in ("0", "auto"):
            r = measure(a, gc, chunk)
            rows.append({"gradient_checkpointing": gc, "loss_chunk_tokens": chunk, "peak_rss_gb": r["peak_rss_gb"],
                         "peak_set_by": peak_phase(r["rss_trace_gb"]), "rss_trace_gb": r["rss_trace_gb"],
                         "first_loss": r["first_loss"], "tokens_per_s": r["tokens_per_s"], "tokens": r["tokens"]})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\nSFT step on {a.model}: batch {a.batch}, {a.steps} timed steps, {a.threads} threads")
    print(f"{'gradient checkpointing':>22s} {'loss_chunk_tokens':>18s} {'peak RSS GB':>12s} {'peak set by':>17s} "
          f"{'first loss':>11s} {'tokens/s':>9s}")
    for r in rows:
        print(f"{'on' if r['gradient_checkpointing'] else 'off':>22s} {r['loss_chunk_tokens']:>18s} "
              f"{r['peak_rss_gb']:12.2f} {r['peak_set_by']:>17s} {r['first_loss']:11.4f} {r['tokens_per_s']:9.1f}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"model": a.model, "batch": a.batch, "steps": a.steps, "threads": a.threads,
                                       "fixed_mmap_threshold": a.fixed_mmap_threshold, "rows": rows}, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
