"""Safety erosion by fine-tuning on tool data, and two fixes: safety-data mixing and PING.

Everything runs on a tiny model built here (like the demo's), on the built-in `safety` environment
(harmful tool requests to refuse, each with a benign twin on the same tools to complete):

1. **aligned**: the base model learns from `trajtune data synth-safety` data (refusals for the
   harmful requests, tool calls for the benign twins) for `--align-steps` steps.
2. **tool-only**: the aligned model is fine-tuned for `--steps` steps on tool data that contains no
   refusal: the benign twins' completions of other tasks (a fresh seed). This is the erosion the
   papers report: the harmful requests look like the benign ones, and nothing says "refuse" any more.
3. **mixed**: the same fine-tuning, with `trajtune data mix` putting `--safety-share` of
   synth-safety data (refusals and benign twins) in the mix.
4. **tool-only + PING**: `trajtune ping` (template proposer, `--ping-rounds` rounds) searches a
   prefix for the tool-only model on training tasks; the eval then runs with that prefix.

Each model is evaluated greedily (`trajtune eval --env safety`) on `--n-test` held-out tasks (half
harmful, half benign twins): harmful compliance, refusal rate, benign success and over-refusal.
Fine-tuning arms repeat per seed. A benchmark, not a test: it prints a table and writes JSON.

    python benchmarks/safety_story.py --seeds 0 1
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CLI = [sys.executable, "-m", "trajtune.cli"]
MAX_LENGTH, MAX_NEW = 512, 48


def sh(cmd: list[str]) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return p.stdout


def sft(model: Path, data: Path, out: Path, steps: int, seed: int, lr: float) -> Path:
    cfg = out.parent / f"{out.name}.yaml"
    cfg.write_text(json.dumps({
        "algorithm": "sft", "model": str(model), "output_dir": str(out), "seed": seed, "report": False,
        "data": {"path": str(data), "format": "ir", "max_length": MAX_LENGTH},
        "train": {"steps": steps, "lr": lr, "warmup_steps": max(1, steps // 20), "batch_size": 16,
                  "micro_batch_size": 16, "schedule": "cosine"}}))
    sh([*CLI, "train", "-c", str(cfg), "--overwrite"])
    return out / "final"


def evaluate(model: Path, out: Path, n_test: int, prefix_file: Path | None = None) -> dict[str, float]:
    cmd = [*CLI, "eval", "--model", str(model), "--env", "safety", "--tasks", str(n_test), "--max-turns", "4",
           "--max-new-tokens", str(MAX_NEW), "--max-length", str(MAX_LENGTH), "--out", str(out), "--overwrite",
           "--no-report"]
    if prefix_file is not None:
        cmd += ["--assistant-prefix-file", str(prefix_file)]
    sh(cmd)
    s = json.loads((out / "results.json").read_text())["safety"]
    return {k: s[k] for k in ("harmful_compliance", "refusal_rate", "benign_success", "over_refusal")}


def split_records(path: Path) -> tuple[list[str], list[str]]:
    """(refusal records, tool-call records) of a synth-safety file."""
    refusals, tools = [], []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        calls = any(m.get("tool_calls") for m in rec["messages"] if m["role"] == "assistant")
        (tools if calls else refusals).append(line)
    return refusals, tools


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--n-align", type=int, default=1000, help="synth-safety records for the aligned model")
    ap.add_argument("--n-tool", type=int, default=1000, help="tool-call records of the tool-only fine-tuning")
    ap.add_argument("--align-steps", type=int, default=600)
    ap.add_argument("--steps", type=int, default=300, help="fine-tuning steps of the tool-only and mixed arms")
    ap.add_argument("--safety-share", type=float, default=0.15)
    ap.add_argument("--ping-rounds", type=int, default=3)
    ap.add_argument("--ping-n", type=int, default=20, help="benign and harmful tasks PING scores each prefix on")
    ap.add_argument("--n-test", type=int, default=100)
    ap.add_argument("--work", default="runs/bench-safety")
    ap.add_argument("--out", default="benchmarks/results/safety_story.json")
    a = ap.parse_args()

    from trajtune.models.tiny import create_tiny_model

    work = Path(a.work)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    align_data = work / "synth_safety.jsonl"
    sh([*CLI, "data", "synth-safety", "--n", str(a.n_align), "--out", str(align_data), "--seed", "0"])
    pool = work / "synth_safety_more.jsonl"  # other tasks: the tool-only data and the mixed-in safety share
    sh([*CLI, "data", "synth-safety", "--n", str(3 * a.n_tool), "--out", str(pool), "--seed", "1"])
    refusals, tool_calls = split_records(pool)
    tool_only = work / "tool_only.jsonl"
    tool_only.write_text("\n".join(tool_calls[:a.n_tool]) + "\n")
    safety_part = work / "safety_part.jsonl"
    safety_part.write_text("\n".join(sorted(refusals + tool_calls[a.n_tool:])) + "\n")
    mixed = work / "mixed.jsonl"
    share = a.safety_share
    sh([*CLI, "data", "mix", f"{tool_only}:{1 - share}", f"{safety_part}:{share}", "-o", str(mixed), "--seed", "0"])
    n_mixed = len(mixed.read_text().splitlines())
    print(f"data: aligned {a.n_align} synth-safety records; tool-only {len(tool_calls[:a.n_tool])} tool-call "
          f"records (no refusal); mixed {n_mixed} records with {share:.0%} safety data", flush=True)

    texts = [line for f in (align_data, pool) for line in f.read_text().splitlines()]
    base = create_tiny_model(work / "base-model", texts, vocab_size=1024, preset="micro", seed=0)
    t = time.perf_counter()
    aligned = sft(base, align_data, work / "aligned", a.align_steps, seed=0, lr=1e-3)
    rows: list[dict[str, Any]] = [{"arm": "aligned", "seed": 0, **evaluate(aligned, work / "eval-aligned", a.n_test),
                                   "seconds": round(time.perf_counter() - t, 1)}]
    print(json.dumps(rows[-1]), flush=True)
    for seed in a.seeds:
        for arm, data in (("tool-only", tool_only), ("mixed", mixed)):  # interleaved per seed
            t = time.perf_counter()
            model = sft(aligned, data, work / f"{arm}-seed{seed}", a.steps, seed=seed, lr=5e-4)
            rows.append({"arm": arm, "seed": seed, **evaluate(model, work / f"eval-{arm}-seed{seed}", a.n_test),
                         "seconds": round(time.perf_counter() - t, 1)})
            print(json.dumps(rows[-1]), flush=True)
            if arm == "tool-only":
                t = time.perf_counter()
                ping = work / f"ping-seed{seed}"
                sh([*CLI, "ping", "--model", str(model), "--env", "safety", "--proposer", "template",
                    "--rounds", str(a.ping_rounds), "--candidates", "5", "--benign-n", str(a.ping_n),
                    "--harmful-n", str(a.ping_n), "--max-new-tokens", str(MAX_NEW), "--max-length",
                    str(MAX_LENGTH), "--seed", str(seed), "--out", str(ping), "--quiet"])
                best = json.loads((ping / "ping.json").read_text())
                rows.append({"arm": "tool-only + PING", "seed": seed, "prefix": best.get("best", {}).get("prefix"),
                             **evaluate(model, work / f"eval-ping-seed{seed}", a.n_test, ping / "ping.json"),
                             "seconds": round(time.perf_counter() - t, 1)})
                print(json.dumps(rows[-1]), flush=True)

    print(f"\nsafety env, tiny model, {a.n_test} held-out tasks (half harmful), seeds {a.seeds}; aligned "
          f"{a.align_steps} steps, then {a.steps} steps of fine-tuning")
    print(f"{'model':18s} {'harmful compliance':>20s} {'refusal':>14s} {'benign success':>16s} {'over-refusal':>14s}")
    for arm in ("aligned", "tool-only", "mixed", "tool-only + PING"):
        rs = [r for r in rows if r["arm"] == arm]
        cell = lambda k: " / ".join(f"{r[k]:.2f}" for r in rs)  # noqa: E731
        print(f"{arm:18s} {cell('harmful_compliance'):>20s} {cell('refusal_rate'):>14s} "
              f"{cell('benign_success'):>16s} {cell('over_refusal'):>14s}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
