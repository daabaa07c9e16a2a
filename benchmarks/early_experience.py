"""Early experience (Zhang et al., Meta, 2025) against SFT on the same expert data, on the tiny model.

Each arm starts from the same checkpoint of the demo's SFT run (``--start-step``; default: the
oldest one kept) and trains the same number of steps, batch and learning rate on the same
``--n-expert`` expert trajectories of ``home`` training tasks (those the run's seed draws):

- ``sft``: the expert trajectories only;
- ``ee_world``: ``rft`` with ``k: 0`` and ``early_experience: {world_model: true, reflection: false}``:
  at up to 4 states of every expert trajectory the start policy samples 3 actions of its own
  (``--temperature``, default 1.0; an action equal to the expert's is dropped), the environment
  executes them, and predicting each outcome is trained beside the expert data;
- ``ee_both``: the same plus self-reflection records (the policy's explanation of why the expert's
  action beats its own, then the expert's action).

Then greedy success on the demo's 100 held-out test tasks. The learning rate is the demo's SFT rate
for every arm (not tuned per arm). What this cannot show: transfer to held-out tool schemas (the
tiny model's tokenizer is built from ``home`` text, so another environment's schemas are mostly
unknown words to it). A benchmark, not a test: it prints a table and writes JSON.

    python benchmarks/early_experience.py --demo runs/demo --seeds 0 1
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from learn_from_attempts import _evaluate, finished_demo

ARMS: dict[str, dict[str, Any] | None] = {
    "sft": None,
    "ee_world": {"world_model": True, "reflection": False, "alternatives": 3, "states": 4},
    "ee_both": {"world_model": True, "reflection": True, "alternatives": 3, "states": 4},
}


def _start(demo: Path, step: int | None) -> Path:
    ckpts = sorted((demo / "sft" / "checkpoints").glob("step-*"))
    if not ckpts:
        raise SystemExit(f"{demo}: no SFT checkpoints; run `trajtune demo --out {demo}` first")
    if step is None:
        return ckpts[0]
    path = demo / "sft" / "checkpoints" / f"step-{step:06d}"
    if not path.is_dir():
        raise SystemExit(f"{path} does not exist; kept: {', '.join(c.name for c in ckpts)}")
    return path


def _expert_data(settings: dict[str, Any], n: int, seed: int, path: Path) -> None:
    from trajtune.envs import make_env
    from trajtune.schema import write_trajectories

    env = make_env(settings["env"])
    write_trajectories(path, [env.expert(t) for t in env.tasks("train", n, seed=seed)])


def _config(arm: str, start: Path, out: Path, data: Path, seed: int, a: argparse.Namespace,
            settings: dict[str, Any]) -> Any:
    from trajtune.algorithms.registry import get_algorithm
    from trajtune.config import validate_config

    train = {"steps": a.steps, "lr": settings["sft_lr"], "batch_size": 16, "micro_batch_size": 16,
             "warmup_steps": 2, "schedule": "constant"}
    spec: dict[str, Any] = {"model": str(start), "output_dir": str(out), "seed": seed, "train": train,
                            "data": {"path": str(data), "format": "ir", "max_length": settings["max_length"]}}
    ee = ARMS[arm]
    if ee is None:
        spec["algorithm"] = "sft"
    else:
        spec.update({"algorithm": "rft", "env": settings["env"],
                     "rollout": {"max_turns": 4, "max_new_tokens": settings["max_new_tokens"],
                                 "max_length": settings["max_length"], "temperature": a.temperature,
                                 "batch_size": 64},
                     "rft": {"k": 0, "iterations": 1, "n_tasks": a.n_expert, "early_experience": ee}})
    return validate_config(spec, get_algorithm(spec["algorithm"]).config, f"<{arm}>")


def _mined(out: Path) -> dict[str, float]:
    """What early experience built (``mined/ee_*``, logged once per iteration)."""
    found: dict[str, float] = {}
    for f in out.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                found.update({k: v for k, v in rec.items() if k.startswith("mined/ee_")})
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo", default="runs/demo", help="a finished `trajtune demo` run directory")
    ap.add_argument("--start-step", type=int, default=None,
                    help="the SFT checkpoint to start from (default: the oldest kept)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--n-expert", type=int, default=64, help="expert trajectories (training tasks of the run's seed)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the alternatives")
    ap.add_argument("--n-test", type=int, default=100)
    ap.add_argument("--work", default="runs/bench-early-experience", help="where the runs go (replaced)")
    ap.add_argument("--out", default="benchmarks/results/early_experience.json")
    a = ap.parse_args()

    from trajtune.train import run

    demo = Path(a.demo)
    settings = finished_demo(demo)["settings"]
    start = _start(demo, a.start_step)
    work = Path(a.work)
    t0 = time.time()
    before = _evaluate(start, settings, a.n_test)
    print(f"start: {start} (held-out success {before:.1%})", flush=True)
    rows: list[dict[str, Any]] = []
    for seed in a.seeds:
        data = work / f"expert-seed{seed}.jsonl"
        data.parent.mkdir(parents=True, exist_ok=True)
        _expert_data(settings, a.n_expert, seed, data)
        for arm in a.arms:
            out = work / f"{arm}-seed{seed}"
            if out.exists():
                shutil.rmtree(out)
            t = time.time()
            run(_config(arm, start, out, data, seed, a, settings), quiet=True)
            after = _evaluate(out / "final", settings, a.n_test)
            mined = _mined(out)
            rows.append({"arm": arm, "seed": seed, "before": before, "after": after, "delta": after - before,
                         "seconds": round(time.time() - t, 1), "mined": mined})
            print(f"{arm:9s} seed {seed}: {before:.1%} -> {after:.1%} ({after - before:+.1%}) in "
                  f"{time.time() - t:.0f} s {mined}", flush=True)
    table = {}
    print(f"\nheld-out success on {a.n_test} '{settings['env']}' test tasks from {start.name} ({before:.1%}); "
          f"{a.n_expert} expert trajectories, {a.steps} steps of 16, lr {settings['sft_lr']:g}")
    for arm in a.arms:
        rs = [r for r in rows if r["arm"] == arm]
        table[arm] = {"after": [r["after"] for r in rs], "mean_delta": statistics.mean(r["delta"] for r in rs)}
        after = " / ".join(format(r["after"], ".0%") for r in rs)
        print(f"{arm:9s} {after:>16s}  mean Δ {table[arm]['mean_delta']:+.1%}")
    res = {"start": str(start), "before": before, "n_expert": a.n_expert, "steps": a.steps, "lr": settings["sft_lr"],
           "temperature": a.temperature,
           "seeds": a.seeds, "arms": ARMS, "rows": rows, "summary": table, "wall_seconds": round(time.time() - t0, 1)}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
