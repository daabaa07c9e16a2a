"""Peak RSS of trajtune's SFT step with the chunked LM head (train.loss_chunk_tokens) on and off.

Whole steps (default): runs `benchmarks/vs_trl.py`'s trajtune worker (the same rows, model,
batches and learner settings as the TRL comparison in docs/speed.md, so the numbers read against
TRL's there), one process per configuration: gradient checkpointing off and on, each with
`loss_chunk_tokens` 0 (off: the model's logits all at once) and `auto`. Reported per
configuration: peak RSS, which phase set it (the peak before and after each optimizer step), the
first step's loss (equal with chunking on and off) and tokens/s (2 timed steps: a rough figure,
not a timing benchmark).

`--forward-backward`: one micro-batch (the same first `--batch` rows) through the SFT loss and its
backward, nothing else, per configuration; the growth of peak RSS after the forward and after the
backward, over the RSS before it. `--all-tokens` trains every token of those rows (continual
pre-training's shape) instead of the assistant turns only.

Peak RSS under glibc's allocator moves by up to ~0.3 GB between runs of the very same code (freed
memory it keeps, which varies with thread timing). `--fixed-mmap-threshold` runs the workers with
`MALLOC_MMAP_THRESHOLD_=131072`, so every tensor above 128 KiB is mapped and returned on free and
the peak RSS follows the live memory (reproducible, slower: compare memory only). Writes JSON.

    python benchmarks/sft_memory.py --model smollm2-135m --steps 2 --batch 2
    python benchmarks/sft_memory.py --forward-backward --all-tokens --fixed-mmap-threshold
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("vs_trl.py")


def _run(cmd: list[str], a: argparse.Namespace, what: str) -> dict[str, Any]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072") if a.fixed_mmap_threshold else None
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"{what} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def measure_step(a: argparse.Namespace, gc: bool, chunk: str) -> dict[str, Any]:
    cmd = [sys.executable, str(WORKER), "--worker", "trajtune", "--model", a.model, "--steps", str(a.steps),
           "--batch", str(a.batch), "--max-length", str(a.max_length), "--threads", str(a.threads),
           "--loss-chunk-tokens", chunk] + (["--gc"] if gc else [])
    r = _run(cmd, a, f"gc {gc}, loss_chunk_tokens {chunk}")
    return {"gradient_checkpointing": gc, "loss_chunk_tokens": chunk, "peak_rss_gb": r["peak_rss_gb"],
            "peak_set_by": peak_phase(r["rss_trace_gb"]), "rss_trace_gb": r["rss_trace_gb"],
            "first_loss": r["first_loss"], "tokens_per_s": r["tokens_per_s"], "tokens": r["tokens"]}


def measure_forward_backward(a: argparse.Namespace, gc: bool, chunk: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--fb-worker", "--model", a.model, "--batch", str(a.batch),
           "--max-length", str(a.max_length), "--threads", str(a.threads), "--chunk", chunk]
    cmd += (["--gc"] if gc else []) + (["--all-tokens"] if a.all_tokens else [])
    return {"gradient_checkpointing": gc, "loss_chunk_tokens": chunk,
            **_run(cmd, a, f"forward+backward, gc {gc}, loss_chunk_tokens {chunk}")}


def peak_phase(trace: list[tuple[str, float]]) -> str:
    """The phase during which the peak RSS last grew by more than 1 %."""
    last, phase = 0.0, "start-up"
    for name, gb in trace:
        if gb > last * 1.01:
            phase = name
        last = max(last, gb)
    return phase


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def fb_worker(a: argparse.Namespace) -> dict[str, Any]:
    """One SFT loss + backward on the first ``--batch`` rows; peak RSS growth after each."""
    import torch

    sys.path.insert(0, str(WORKER.parent))
    from vs_trl import _rows

    from trajtune.algorithms.batch import collate
    from trajtune.algorithms.sft import SFTObjective
    from trajtune.models.loading import load_model, resolve_model

    torch.set_num_threads(a.threads)
    path = resolve_model(a.model).path
    tok, rows = _rows(path, a.batch, a.max_length)
    if a.all_tokens:
        for t in rows:
            t.weight = [1.0] * len(t)
    model = load_model(path, dtype="float32", gradient_checkpointing=a.gc)
    model.train()
    chunk = a.chunk if a.chunk == "auto" else int(a.chunk)
    batch = collate(rows, tok.pad_token_id, loss_chunk_tokens=chunk)
    objective = SFTObjective(all_tokens=a.all_tokens)
    base = _peak_mb()
    loss, _ = objective.loss_sum(model, batch)
    forward = _peak_mb()
    loss.backward()
    return {"tokens": [len(t) for t in rows], "trained": int(objective._mask(batch).sum()),
            "loss": float(loss.detach()), "rss_before_mb": base, "forward_mb": forward - base,
            "forward_backward_mb": _peak_mb() - base}


def _print(rows: list[dict[str, Any]], cols: list[str]) -> None:
    print(" ".join(f"{c:>22s}" for c in cols))
    for r in rows:
        print(" ".join(f"{r[c]:>22.4g}" if isinstance(r[c], float) else f"{str(r[c]):>22s}" for c in cols))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per run (after one warm-up step)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=640)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--forward-backward", action="store_true", help="one micro-batch's loss + backward only")
    ap.add_argument("--all-tokens", action="store_true", help="--forward-backward: train every token of the rows")
    ap.add_argument("--fixed-mmap-threshold", action="store_true",
                    help="peak RSS that follows the live memory (see above)")
    ap.add_argument("--out", default=None, help="JSON (default benchmarks/results/sft_memory[_fb].json)")
    ap.add_argument("--fb-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gc", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--chunk", default="auto", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.fb_worker:
        print(json.dumps(fb_worker(a)))
        return
    measure = measure_forward_backward if a.forward_backward else measure_step
    rows = []
    for gc in (False, True):
        for chunk in ("0", "auto"):
            rows.append(measure(a, gc, chunk))
            print(json.dumps(rows[-1]), flush=True)
    print(f"\nSFT on {a.model}: batch {a.batch}, {a.threads} threads"
          + (", forward+backward only" if a.forward_backward else f", {a.steps} timed steps")
          + (", every token trained" if a.all_tokens else "")
          + (", fixed mmap threshold" if a.fixed_mmap_threshold else ""))
    _print(rows, ["gradient_checkpointing", "loss_chunk_tokens"]
           + (["forward_mb", "forward_backward_mb", "loss"] if a.forward_backward
              else ["peak_rss_gb", "peak_set_by", "first_loss", "tokens_per_s"]))
    out = Path(a.out or f"benchmarks/results/sft_memory{'_fb' if a.forward_backward else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": a.model, "batch": a.batch, "steps": a.steps, "threads": a.threads,
                               "forward_backward": a.forward_backward, "all_tokens": a.all_tokens,
                               "fixed_mmap_threshold": a.fixed_mmap_threshold, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
