"""Does the policy learn from its own attempts? RFT, DPO and GRPO from the demo's under-trained
checkpoint, with the same number of rollouts each, scored on held-out tasks over several seeds.

The starting point is the checkpoint `trajtune demo` picks to show RL learning: an SFT checkpoint
of the tiny model that still fails some training tasks (runs/demo/sft/checkpoints/step-N). Each
arm spends the same rollout budget R in the `home` environment at the demo's sampling temperature:

- rft:  one iteration, R / k attempts per task; the verified successes are trained with the SFT loss
- dpo:  one iteration, R / k tasks × k attempts; success ≻ failure pairs of one task, sigmoid loss
- grpo: R / (tasks_per_step × group_size) steps of the demo's GRPO settings

then all are evaluated greedily on the demo's 100 held-out test tasks. GRPO draws its tasks from
the same R / k training tasks as the others.

Model selection never looks at the test tasks: each arm's learning rate is chosen from LRS by a
selection run (seed 100, not a reported seed) scored on 100 *validation* tasks: training-split
tasks drawn with another seed, so no run trains on them. The chosen rate is then run with each
reported seed; the seed changes sampling, task draws and data order. A benchmark, not a test: it
prints a table and writes JSON, and asserts nothing.

    python benchmarks/learn_from_attempts.py --demo runs/demo --seeds 0 1 --rollouts 1024
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

K = 4  # attempts per task for rft and dpo
TASKS_PER_STEP, GROUP = 8, 8  # grpo, as in the demo

ARMS: dict[str, dict[str, Any]] = {  # the learning rate comes from LRS (selected)
    # steps are sized for the ~100-300 kept successes / ~100 pairs that R = 1024 yields from the demo checkpoint
    "rft": {"train": {"steps": 24, "batch_size": 16, "micro_batch_size": 16, "warmup_steps": 2,
                      "schedule": "constant"},
            "rft": {"iterations": 1, "k": K, "per_task_quota": 1}},
    "dpo": {"train": {"steps": 24, "batch_size": 8, "micro_batch_size": 8, "warmup_steps": 2,
                      "schedule": "constant"},
            "dpo": {"iterations": 1, "k": K, "beta": 0.1, "max_pairs_per_task": 2, "reference": "model"}},
    "grpo": {"train": {"schedule": "constant", "warmup_steps": 5, "micro_batch_size": 32},
             "rl": {"estimator": "grpo", "tasks_per_step": TASKS_PER_STEP, "group_size": GROUP,
                    "drop_equal_groups": True}},
}


LRS = {"rft": [2.0e-4, 5.0e-4, 1.0e-3], "dpo": [1.0e-5, 3.0e-5, 1.0e-4], "grpo": [5.0e-5, 1.0e-4, 2.0e-4]}
SELECTION_SEED, VALIDATION_SEED = 100, 999


def finished_demo(demo: Path) -> dict[str, Any]:
    """The summary of a finished ``trajtune demo`` run (its settings and chosen checkpoint)."""
    if not (demo / "summary.json").exists():
        raise SystemExit(f"{demo} holds no finished demo; run `trajtune demo --out {demo}` first (257 s on 2 CPU cores)")
    return json.loads((demo / "summary.json").read_text())


def _weak_checkpoint(demo: Path, summary: dict[str, Any]) -> Path:
    ckpt = demo / "sft" / "checkpoints" / f"step-{summary.get('weak_sft_step', -1):06d}"
    if not ckpt.is_dir():
        raise SystemExit(f"{demo}: no under-trained checkpoint ({ckpt}); run `trajtune demo --out {demo}` first")
    return ckpt


def _evaluate(model_dir: Path, settings: dict[str, Any], n_test: int, split: str = "test") -> float:
    from trajtune.envs import make_env
    from trajtune.eval.run import evaluate
    from trajtune.models.loading import load_model, load_tokenizer
    from trajtune.rollout import RolloutConfig

    tasks = make_env(settings["env"]).tasks(split, n_test, seed=0 if split == "test" else VALIDATION_SEED)
    ro = RolloutConfig(max_turns=4, max_new_tokens=settings["max_new_tokens"], max_length=settings["max_length"],
                       temperature=0.0, batch_size=64)
    metrics, _ = evaluate(load_model(str(model_dir), trainable=False), load_tokenizer(str(model_dir)),
                          lambda: make_env(settings["env"]), tasks, ro, seed=0)
    return float(metrics["success"])


def _config(arm: str, start: Path, out: Path, seed: int, rollouts: int, settings: dict[str, Any], lr: float) -> Any:
    from trajtune.algorithms.registry import get_algorithm
    from trajtune.config import validate_config

    spec = json.loads(json.dumps(ARMS[arm]))
    rollout = {"max_turns": 4, "max_new_tokens": settings["max_new_tokens"], "max_length": settings["max_length"],
               "temperature": settings["rl_temperature"], "batch_size": 64}
    data: dict[str, Any] = {"model": str(start), "output_dir": str(out), "seed": seed, "env": settings["env"],
                            "rollout": rollout, **spec}
    data["train"]["lr"] = lr
    if arm == "grpo":
        data["algorithm"] = "rl"
        data["train"]["steps"] = rollouts // (TASKS_PER_STEP * GROUP)
        data["rl"]["n_train_tasks"] = rollouts // K
    else:
        data["algorithm"] = arm
        data[arm]["n_tasks"] = rollouts // K
    return validate_config(data, get_algorithm(data["algorithm"]).config, f"<{arm}>")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo", default="runs/demo", help="a finished `trajtune demo` run directory")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--rollouts", type=int, default=1024, help="rollout budget per arm")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--n-test", type=int, default=100)
    ap.add_argument("--work", default="runs/bench-attempts", help="where the runs go (replaced)")
    ap.add_argument("--out", default="benchmarks/results/learn_from_attempts.json")
    a = ap.parse_args()

    from trajtune.train import run

    demo = Path(a.demo)
    summary = finished_demo(demo)
    settings = summary["settings"]
    start = _weak_checkpoint(demo, summary)
    work = Path(a.work)
    t0 = time.time()
    before = _evaluate(start, settings, a.n_test)
    print(f"start: {start} (held-out success {before:.1%})", flush=True)

    def train_and_score(arm: str, seed: int, lr: float, split: str) -> tuple[float, dict[str, Any], str, float]:
        out = work / f"{arm}-seed{seed}-lr{lr:g}"
        if out.exists():
            shutil.rmtree(out)
        t = time.time()
        try:
            result = run(_config(arm, start, out, seed, a.rollouts, settings, lr), quiet=True)
            return _evaluate(out / "final", settings, a.n_test, split), result, "", time.time() - t
        except Exception as e:  # a mining run that finds nothing to train on is a result too
            return float("nan"), {}, f"{type(e).__name__}: {e}", time.time() - t

    # 1. learning rate per arm, on validation tasks (never the test tasks)
    val_before = _evaluate(start, settings, a.n_test, "train")
    selection: dict[str, Any] = {}
    for arm in a.arms:
        scores = {}
        for lr in LRS[arm]:
            scores[lr], _, note, secs = train_and_score(arm, SELECTION_SEED, lr, "train")
            print(f"select {arm:5s} lr {lr:g}: validation {val_before:.1%} → {scores[lr]:.1%} in {secs:.0f} s {note}",
                  flush=True)
        best = max(LRS[arm], key=lambda x: (scores[x] if scores[x] == scores[x] else -1.0, -x))
        selection[arm] = {"validation": {str(k): v for k, v in scores.items()}, "lr": best}

    # 2. the chosen rate, every reported seed, scored on the held-out test tasks
    rows: list[dict[str, Any]] = []
    for seed in a.seeds:
        for arm in a.arms:
            lr = selection[arm]["lr"]
            after, result, note, secs = train_and_score(arm, seed, lr, "test")
            rows.append({"arm": arm, "seed": seed, "lr": lr, "rollouts": a.rollouts, "before": before, "after": after,
                         "delta": after - before, "seconds": round(secs, 1), "note": note,
                         **{k: v for k, v in result.items() if k in ("step", "pairs")}})
            print(f"{arm:5s} seed {seed} lr {lr:g}: {before:.1%} → {after:.1%} ({after - before:+.1%}) in {secs:.0f} s "
                  f"{note}", flush=True)

    print(f"\nheld-out success on {a.n_test} '{settings['env']}' test tasks, from {start.name} "
          f"({before:.1%}), {a.rollouts} rollouts per arm")
    print(f"{'arm':6s} {'lr':>8s} {'seeds':>8s} {'after (per seed)':>20s} {'mean Δ':>8s} {'min Δ':>7s}")
    table = {}
    for arm in a.arms:
        rs = [r for r in rows if r["arm"] == arm]
        deltas = [r["delta"] for r in rs]
        table[arm] = {"after": [r["after"] for r in rs], "mean_delta": statistics.mean(deltas),
                      "min_delta": min(deltas)}
        print(f"{arm:6s} {selection[arm]['lr']:8g} {' '.join(str(r['seed']) for r in rs):>8s} "
              f"{' '.join(format(r['after'], '.1%') for r in rs):>20s} {table[arm]['mean_delta']:+8.1%} "
              f"{table[arm]['min_delta']:+7.1%}")
    res = {"start": str(start), "before": before, "validation_before": val_before, "rollouts": a.rollouts,
           "seeds": a.seeds, "arms": ARMS, "lrs": LRS, "selection": selection, "rows": rows, "summary": table,
           "wall_seconds": round(time.time() - t0, 1)}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
