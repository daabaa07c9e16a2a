"""Error-masked SFT against plain SFT on expert data with injected errors, same budget, 2+ seeds.

Data: the demo's `home` expert trajectories (runs/demo/data/train.jsonl). In a fraction
`--error-rate` of them, one tool call is preceded by a mistaken one: the same call with the room
misspelled (one letter dropped), answered with the environment's own error text ("Error: unknown
room 'X'"), after which the expert's correct call follows, the recovery. This is what real agent
logs look like: mistakes, then fixes.

Arms (identical data, steps, learning rate and seed; only the loss weights differ):

- plain:  `data.train_on: all`: every assistant turn is trained, the mistakes too;
- masked: `data.mask_errors: true`: the mistaken turns stay in context with weight 0;
- filtered: `data.filters: {errors: true}`: records with a mistake are removed before training
  (what `trajtune data filter --errors` writes), so fewer records train for the same steps.

Each arm trains the demo's freshly built base model (runs/demo/base-model) with the demo's SFT
settings for `--steps` steps, then `trajtune eval` scores it greedily on `--tasks` held-out `home`
tasks: success, mean turns, and the share of episodes in which the model made a call that drew an
error. A benchmark, not a test: it prints a table and writes JSON, and asserts nothing.

    python benchmarks/sft_variants.py --demo runs/demo --seeds 0 1 --steps 300 [--arms plain masked filtered]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


ARMS = {"plain": ["data.train_on=all"], "masked": ["data.train_on=all", "data.mask_errors=true"],
        "filtered": ["data.train_on=all", "data.filters.errors=true"]}


def inject(record: dict[str, Any], rng: random.Random) -> dict[str, Any] | None:
    """The record with one mistaken call (room misspelled) + its error before a correct call; None
    when it has no call with a room argument."""
    msgs = record["messages"]
    spots = [i for i, m in enumerate(msgs) if m["role"] == "assistant" and m.get("tool_calls")
             and len(m["tool_calls"]) == 1 and len((m["tool_calls"][0].get("arguments") or {}).get("room", "")) > 3]
    if not spots:
        return None
    i = rng.choice(spots)
    call = msgs[i]["tool_calls"][0]
    room = call["arguments"]["room"]
    k = rng.randrange(1, len(room))
    typo = room[:k] + room[k + 1:]
    cid = f"{call['id']}_err"
    wrong = {"role": "assistant", "tool_calls": [{**call, "id": cid, "arguments": {**call["arguments"], "room": typo}}],
             "extra": {}}
    error = {"role": "tool", "content": f"Error: unknown room '{typo}'", "name": call["name"], "origin": "environment",
             "tool_call_id": cid, "extra": {}}
    return {**record, "id": record["id"] + "-err", "messages": msgs[:i] + [wrong, error] + msgs[i:]}


def make_data(src: Path, dst: Path, rate: float, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    out, n_err = [], 0
    for line in src.read_text().splitlines():
        rec = json.loads(line)
        if rng.random() < rate:
            bad = inject(rec, rng)
            if bad is not None:
                rec, n_err = bad, n_err + 1
        out.append(json.dumps(rec))
    dst.write_text("\n".join(out) + "\n")
    return {"records": len(out), "with_error": n_err}


def run(cmd: list[str]) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{p.stderr[-3000:]}")


def errors_made(episodes: Path) -> float:
    eps = [json.loads(x) for x in episodes.read_text().splitlines() if x.strip()]
    bad = sum(1 for e in eps if any(m["role"] == "tool" and str(m.get("content", "")).lower().startswith("error")
                                     for m in e["messages"]))
    return bad / max(1, len(eps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo", default="runs/demo", help="a finished `trajtune demo` directory")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--error-rate", type=float, default=0.5)
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--work", default="runs/bench-sft-variants")
    ap.add_argument("--out", default="benchmarks/results/sft_variants.json")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    a = ap.parse_args()

    demo, work = Path(a.demo), Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    data = work / "train_with_errors.jsonl"
    counts = make_data(demo / "data" / "train.jsonl", data, a.error_rate, seed=0)
    print(f"data: {counts['records']} records, {counts['with_error']} with an injected mistake", flush=True)
    arms = {k: ARMS[k] for k in a.arms}
    rows: list[dict[str, Any]] = []
    for seed in a.seeds:
        for arm, sets in arms.items():  # interleaved: plain, masked, plain, masked
            out = work / f"{arm}-seed{seed}"
            cfg = work / "sft.yaml"
            cfg.write_text(json.dumps({
                "algorithm": "sft", "model": str(demo / "base-model"), "output_dir": str(out), "seed": seed,
                "data": {"path": str(data), "format": "ir", "max_length": 512},
                "train": {"steps": a.steps, "lr": 1e-3, "warmup_steps": a.steps // 20, "batch_size": 16,
                          "micro_batch_size": 16, "schedule": "cosine"}, "report": False}))
            t = time.perf_counter()
            run([sys.executable, "-m", "trajtune.cli", "train", "-c", str(cfg), "--overwrite",
                 *[x for s in sets for x in ("--set", s)]])
            ev = work / f"eval-{arm}-seed{seed}"
            run([sys.executable, "-m", "trajtune.cli", "eval", "--model", str(out / "final"), "--env", "home",
                 "--tasks", str(a.tasks), "--max-turns", "4", "--out", str(ev), "--overwrite", "--no-report"])
            metrics = json.loads((ev / "results.json").read_text())["metrics"]
            result = json.loads((out / "result.json").read_text())
            masked = result.get("error_turns_masked", {})
            row = {"arm": arm, "seed": seed, "success": metrics["success"], "mean_turns": metrics["mean_turns"],
                   "episodes_with_error_call": errors_made(ev / "episodes.jsonl"), "masked_turns": masked,
                   **({"filters": result["filters"]} if "filters" in result else {}),
                   "seconds": round(time.perf_counter() - t, 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\nhome, {a.steps} SFT steps, {counts['with_error']}/{counts['records']} records with a mistake, "
          f"{a.tasks} held-out tasks, seeds {a.seeds}")
    print(f"{'arm':8s} {'success':>18s} {'mean turns':>12s} {'episodes with an error call':>28s}")
    for arm in arms:
        rs = [r for r in rows if r["arm"] == arm]
        succ = " / ".join(f"{r['success']:.2f}" for r in rs)
        print(f"{arm:8s} {succ:>18s} {statistics.mean(r['mean_turns'] for r in rs):12.2f} "
              f"{statistics.mean(r['episodes_with_error_call'] for r in rs):28.2f}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"steps": a.steps, "error_rate": a.error_rate, "data": counts,
                                       "tasks": a.tasks, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
