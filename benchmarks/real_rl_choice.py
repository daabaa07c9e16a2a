"""Choosing the real demo's RL settings on validation tasks, never on the test tasks or BFCL.

From a finished real-model demo's SFT adapter (``runs/demo-real/sft/final``), runs the demo's RL
stage (``trajtune.demo_real.rl_config``) once per arm — a reward (``decomposed``: the verdict plus
the call scored by parts; ``verdict``: 1 for the right call, else 0) and a learning rate — with a
seed no demo uses (other training tasks and samples), and scores each on validation tasks: ``fncall``
tasks of the *training* split (functions seen in training, tasks no run trained on), greedy. The
SFT adapter itself is scored the same way, as the baseline.

    python benchmarks/real_rl_choice.py --demo runs/real-s0 --arms decomposed:5e-5 decomposed:2e-4 verdict:2e-4

Prints a table and writes ``benchmarks/results/real_rl_choice.json``; reuses finished arms.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def validation(model: str, out: Path, p: dict[str, Any], n: int, seed: int) -> float:
    from trajtune.demo_real import _env_kwargs, _eval_once
    from trajtune.eval.harness import EvalSettings

    s = EvalSettings(model=model, env="fncall", env_kwargs=_env_kwargs(p), tasks=n, split="train", seed=seed,
                     max_new_tokens=p["max_new_tokens"], batch_size=p["eval_batch_size"])
    return float(_eval_once(s, out)["metrics"]["success"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", type=Path, required=True, help="a finished real-model demo directory")
    ap.add_argument("--arms", nargs="+", default=["decomposed:5e-5", "decomposed:2e-4", "verdict:2e-4"],
                    help="REWARD:LR per arm")
    ap.add_argument("--seed", type=int, default=100, help="the RL runs' seed (the demo's runs use 0 and 1)")
    ap.add_argument("--steps", type=int, default=None, help="RL steps per arm (default: the demo's rl_steps)")
    ap.add_argument("--tasks", type=int, default=100, help="validation tasks")
    ap.add_argument("--val-seed", type=int, default=500, help="seed of the validation tasks")
    ap.add_argument("--out", type=Path, default=None, help="work directory (default: DEMO/rl-choice)")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "real_rl_choice.json")
    a = ap.parse_args()

    from trajtune.demo_real import rl_config
    from trajtune.train import run

    settings = json.loads((a.demo / "demo_settings.json").read_text())
    work = a.out or a.demo / "rl-choice"
    rows: list[dict[str, Any]] = []
    t = time.time()
    base = validation(str(a.demo / "sft" / "final"), work / "val-sft", settings, a.tasks, a.val_seed)
    rows.append({"arm": "SFT (no RL)", "validation": base, "seconds": round(time.time() - t, 1)})
    for arm in a.arms:
        reward, _, lr = arm.partition(":")
        p = {**settings, "rl_reward": reward, "rl_lr": float(lr), "rl_steps": a.steps or settings["rl_steps"] or 16}
        cfg = rl_config(a.demo, p, a.seed)
        name = f"{reward}-lr{lr}"
        cfg = cfg.model_copy(update={"output_dir": str(work / name)})
        t = time.time()
        run(cfg, resume=(work / name).exists(), quiet=True)
        rl_s = round(time.time() - t, 1)
        v = validation(str(work / name / "final"), work / f"val-{name}", settings, a.tasks, a.val_seed)
        rows.append({"arm": name, "reward": reward, "lr": float(lr), "validation": v, "rl_seconds": rl_s})
        print(f"{name}: validation {v:.0%} ({rl_s:.0f} s)", flush=True)
    print(f"\n| arm | validation success ({a.tasks} train-split fncall tasks, seed {a.val_seed}) |\n|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {r['validation']:.0%} |")
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({"demo": str(a.demo), "seed": a.seed, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
