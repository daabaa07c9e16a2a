"""Credit assignment across turns: episode-level GRPO against turn-level credit and MC-Critic.

Same start as benchmarks/learn_from_attempts.py: the demo's under-trained SFT checkpoint of the
`home` model (runs/demo/sft/checkpoints/step-N, the one the demo picks to show RL learning), the
demo's GRPO settings (8 tasks × 8 samples per step, temperature 0.7) and GRPO's learning rate
selected there (5e-5), for the same number of policy updates. Arms:

- episode:   `rl.credit: episode` (GRPO: the episode's group-normalised reward on every token)
- turn:      `rl.credit: turn`, γ = 1 (each turn's return, normalised across the group at its depth)
- mc_critic: `rl.credit: mc_critic`, M = 2 rollouts per state, λ = 1 (A_k = G_k − V(s_k))
- gae:       `rl.credit: gae`, PPO with a learned value head, token-level GAE λ = 0.95, γ = 1
- mc_blend:  `rl.credit: mc_critic` as above with the learned value blended in (w = 0.5)
- gigpo:     `rl.credit: gigpo`, γ = 1, ω = 1, anchor states from the observation history (the
             episode's advantage plus a step advantage among the steps taken from the same state)

MC-Critic spends M extra rollouts per turn of every episode; the table reports the rollouts each
arm used. `home` rewards only the outcome (1 when the task is done), so turn-level credit differs
from episode-level only in grouping by depth, and MC-Critic only in its per-state baseline.
Greedy evaluation on the demo's 100 held-out test tasks. A benchmark, not a test.

    python benchmarks/credit.py --demo runs/demo --seeds 0 1 --steps 16 [--arms episode gae]
    python benchmarks/credit.py --arms episode gigpo --seeds 0 1 2 3 --out benchmarks/results/credit_gigpo.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("learn_from_attempts", HERE / "learn_from_attempts.py")
lfa = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(lfa)  # type: ignore[union-attr]

ARMS: dict[str, dict[str, Any]] = {
    "episode": {},
    "turn": {"credit": "turn"},
    "mc_critic": {"credit": "mc_critic", "mc_critic": {"samples": 2, "lam": 1.0}},
    "gae": {"credit": "gae", "value": {"vf_coef": 0.1, "clip": 0.2, "lam": 0.95}},
    "mc_blend": {"credit": "mc_critic", "mc_critic": {"samples": 2, "lam": 1.0, "value_weight": 0.5}},
    "gigpo": {"credit": "gigpo", "gigpo": {"step_weight": 1.0, "anchor": "history"}},
}
#: arms that compute their own advantages (no group estimator)
OWN_ADVANTAGES = ("mc_critic", "gae", "mc_blend")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo", default="runs/demo")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--n-test", type=int, default=100)
    ap.add_argument("--work", default="runs/bench-credit")
    ap.add_argument("--out", default="benchmarks/results/credit.json")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS), help="the arms to run")
    a = ap.parse_args()

    from trajtune.algorithms.registry import get_algorithm
    from trajtune.config import validate_config
    from trajtune.train import run

    demo = Path(a.demo)
    summary = json.loads((demo / "summary.json").read_text())
    settings = summary["settings"]
    start = lfa._weak_checkpoint(demo, summary)
    before = lfa._evaluate(start, settings, a.n_test)
    print(f"start: {start} (held-out success {before:.1%})", flush=True)
    rows = []
    for seed in a.seeds:
        for arm, rl in ((k, ARMS[k]) for k in a.arms):
            out = Path(a.work) / f"{arm}-seed{seed}"
            if out.exists():
                shutil.rmtree(out)
            data = {"algorithm": "rl", "model": str(start), "output_dir": str(out), "seed": seed, "env": settings["env"],
                    "report": False,
                    "rollout": {"max_turns": 4, "max_new_tokens": settings["max_new_tokens"],
                                "max_length": settings["max_length"], "temperature": settings["rl_temperature"],
                                "batch_size": 64},
                    "train": {"steps": a.steps, "lr": a.lr, "schedule": "constant", "warmup_steps": 5,
                              "micro_batch_size": 32},
                    "rl": {"estimator": "grpo", "tasks_per_step": lfa.TASKS_PER_STEP, "group_size": lfa.GROUP,
                           "drop_equal_groups": True, "n_train_tasks": a.steps * lfa.TASKS_PER_STEP, **rl}}
            if arm in OWN_ADVANTAGES:
                data["rl"].pop("estimator")
            t = time.time()
            run(validate_config(data, get_algorithm("rl").config, f"<{arm}>"), quiet=True)
            secs = time.time() - t
            after = lfa._evaluate(out / "final", settings, a.n_test)
            logs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
            sampled = a.steps * lfa.TASKS_PER_STEP * lfa.GROUP + sum(m.get("mc_rollouts", 0.0) for m in logs)
            rows.append({"arm": arm, "seed": seed, "before": before, "after": after, "delta": after - before,
                         "rollouts": int(sampled), "seconds": round(secs, 1)})
            anchored = [m["gigpo/anchored_steps"] for m in logs if "gigpo/anchored_steps" in m]
            if anchored:  # how often states recurred: the share of steps that had a step group
                rows[-1]["anchored_steps"] = round(statistics.mean(anchored), 3)
            print(json.dumps(rows[-1]), flush=True)
    print(f"\nheld-out success on {a.n_test} test tasks from {start.name} ({before:.1%}), {a.steps} GRPO steps, "
          f"lr {a.lr:g}")
    print(f"{'arm':10s} {'after per seed':>18s} {'mean Δ':>8s} {'rollouts':>9s} {'s/run':>7s}")
    for arm in a.arms:
        rs = [r for r in rows if r["arm"] == arm]
        print(f"{arm:10s} {' / '.join(format(r['after'], '.0%') for r in rs):>18s} "
              f"{statistics.mean(r['delta'] for r in rs):+8.1%} {rs[0]['rollouts']:9d} "
              f"{statistics.mean(r['seconds'] for r in rs):7.0f}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"start": str(start), "before": before, "steps": a.steps, "lr": a.lr,
                                       "arms": ARMS, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
