"""The same real-model checkpoint, three ways to learn from its own attempts: RFT, DPO and GRPO.

From a finished real-model demo's SFT adapter (``trajtune demo --model smollm2-135m``, e.g.
``runs/real-s0/sft/final``), each arm spends the same rollout budget R on fresh ``fncall`` training
tasks (single call, the BFCL shape) at the RL stage's sampling temperature, keeps training the SFT
adapter, and is scored greedily on the demo's held-out ``fncall`` tasks and on BFCL ``simple_python``
entries 0–99 (the same sets as the demo's SFT row, so the rows compare):

- rft:  R / k tasks × k attempts; one verified success per task is trained with the SFT loss
- dpo:  R / k tasks × k attempts; success ≻ failure pairs of one task (trajectory level), sigmoid
        loss, β 0.1, the reference is the SFT adapter (swapped in, no second model)
- grpo: the demo's RL stage (``trajtune.demo_real.rl_config``): R / (tasks × group) steps,
        decomposed tool-call reward, groups whose rewards are all equal left out

Model selection never looks at the test tasks or at BFCL: the rft and dpo learning rates are chosen
from LRS by seed-0 runs scored on validation tasks (100 ``fncall`` tasks of the *training* split,
seed 500: functions seen in training, tasks no run trained on); the GRPO rate is the demo's, chosen
the same way by ``benchmarks/real_rl_choice.py``. The chosen seed-0 run is then also the reported
seed-0 row; other seeds change the task draw, the samples and the data order. GRPO's seed-0 row is
the demo's own RL stage, read back. Each training run is its own process, so its peak RSS is its own.

    python benchmarks/real_learn_from_attempts.py --demo runs/real-s0 --seeds 0 1

Prints a table and writes ``benchmarks/results/real_learn_from_attempts.json``; finished runs and
evaluations in the work directory are reused, so a killed benchmark continues where it stopped.
A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from _child_jobs import measured, run_child  # benchmarks/ is on sys.path when this script runs

K = 4  # attempts per task for rft and dpo
LRS = {"rft": [1e-4, 3e-4], "dpo": [5e-5, 2e-5]}  # the first of each is tried first
SELECT_SEED, VAL_TASKS, VAL_SEED = 0, 100, 500


def _rollout(p: dict[str, Any]) -> dict[str, Any]:
    return {"max_turns": 1, "max_new_tokens": p["rl_max_new_tokens"], "max_length": p["max_length"],
            "temperature": p["rl_temperature"], "batch_size": p["rl_tasks_per_step"] * p["rl_group_size"]}


def config(arm: str, demo: Path, out: Path, p: dict[str, Any], seed: int, lr: float, budget: int) -> Any:
    """The arm's run config; every arm continues the demo's SFT adapter on tasks seeded by seed + 1000
    (as the demo's RL stage: training tasks the SFT data did not draw)."""
    from trajtune.algorithms.registry import get_algorithm
    from trajtune.demo_real import _env_kwargs, rl_config

    if arm == "grpo":
        steps = budget // (p["rl_tasks_per_step"] * p["rl_group_size"])
        cfg = rl_config(demo, {**p, "rl_steps": steps, "rl_lr": lr}, seed)
        return cfg.model_copy(update={"output_dir": str(out)})
    data: dict[str, Any] = {
        "algorithm": arm, "model": {"name_or_path": str(demo / "sft" / "final"), "dtype": "float32"},
        "output_dir": str(out), "seed": seed + 1000, "report": False,
        "env": {"name": "fncall", "kwargs": _env_kwargs(p)}, "rollout": _rollout(p)}
    if arm == "rft":  # ~R/k·success-rate kept examples; trained as the SFT stage trains (batch 4)
        data["rft"] = {"iterations": 1, "n_tasks": budget // K, "k": K, "per_task_quota": 1}
        data["train"] = {"steps": 32, "lr": lr, "batch_size": p["batch_size"], "micro_batch_size": p["batch_size"],
                         "warmup_steps": 2, "schedule": "constant"}
    else:  # ~2 pairs per task with mixed results; 16 steps of 8 pairs
        data["dpo"] = {"iterations": 1, "n_tasks": budget // K, "k": K, "beta": 0.1, "max_pairs_per_task": 2,
                       "reference": "model"}
        data["train"] = {"steps": 16, "lr": lr, "batch_size": 8, "micro_batch_size": 8, "warmup_steps": 2,
                         "schedule": "constant"}
    return get_algorithm(arm).config.model_validate(data)


def _train_job(spec: dict[str, Any]) -> dict[str, Any]:
    """One training run, in this (child) process: its wall time and its own peak RSS."""
    from trajtune.train import run

    cfg = config(spec["arm"], Path(spec["demo"]), Path(spec["out"]), spec["p"], spec["seed"], spec["lr"],
                 spec["budget"])
    result, cost = measured(lambda: run(cfg, resume=Path(spec["out"]).exists(), quiet=True))
    last = result.get("last", {}) if isinstance(result, dict) else {}
    return {**cost, "last": {k: v for k, v in last.items() if isinstance(v, (int, float))}}


def train(spec: dict[str, Any]) -> dict[str, Any]:
    """A finished run is read back (its ``bench.json``); otherwise it runs (or resumes) in a child process."""
    return run_child(__file__, spec, Path(spec["out"]) / "bench.json",
                     f"{spec['arm']} lr {spec['lr']:g} seed {spec['seed']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo", type=Path, default=Path("runs/real-s0"), help="a finished real-model demo directory")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--arms", nargs="+", default=["rft", "dpo", "grpo"], choices=["rft", "dpo", "grpo"])
    ap.add_argument("--budget", type=int, default=512, help="rollouts per arm (the demo's RL stage: 16 × 4 × 8)")
    ap.add_argument("--work", type=Path, default=None, help="work directory (default: DEMO/attempts)")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "real_learn_from_attempts.json")
    ap.add_argument("--keep-choice", action="store_true",
                    help="read the chosen rates, the validation scores and the rows already measured from --json "
                         "(when the work directory that measured them is gone): no selection runs, only the rows "
                         "of --seeds x --arms that --json lacks")
    ap.add_argument("--job", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.job:
        print(json.dumps(_train_job(json.loads(a.job))), flush=True)
        return

    from real_rl_choice import validation  # benchmarks/ is on sys.path when this script runs

    from trajtune.demo_real import _evaluate

    demo = a.demo
    p = json.loads((demo / "demo_settings.json").read_text())
    eval_seed = p["seed"]  # the demo's held-out sets, so every row compares with its SFT row
    work = a.work or demo / "attempts"
    work.mkdir(parents=True, exist_ok=True)
    sft = str(demo / "sft" / "final")
    t0 = time.time()

    def spec(arm: str, seed: int, lr: float) -> dict[str, Any]:
        return {"arm": arm, "demo": str(demo), "out": str(work / f"{arm}-s{seed}-lr{lr:g}"), "p": p, "seed": seed,
                "lr": lr, "budget": a.budget}

    old = json.loads(a.json.read_text()) if a.keep_choice else None
    base_val = old["sft_validation"] if old else validation(sft, work / "val-sft", p, VAL_TASKS, VAL_SEED)
    base = _evaluate(sft, demo / "eval-sft", p, eval_seed)
    if old and base != old["sft"]:
        raise SystemExit(f"--keep-choice: {sft} scores {base} on the test sets, the rows in {a.json} started from "
                         f"{old['sft']}: another SFT adapter")
    print(f"SFT adapter {sft}: validation {base_val:.0%}, held-out fncall {base['fncall']:.0%}, "
          f"BFCL simple_python {base['bfcl_simple_python']:.0%}", flush=True)

    def save(rows: list[dict[str, Any]], done: bool) -> None:  # after every row: a killed run keeps what it has
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"demo": str(demo), "sft": base, "sft_validation": base_val, "budget": a.budget,
                                      "lrs": LRS, "selection": selection, "chosen": chosen, "rows": rows,
                                      "finished": done, "wall_seconds": round(time.time() - t0, 1)}, indent=1))

    # Order: what a short session can afford first. (1) each arm's first rate: trained, scored on
    # validation, and its seed-0 row on the test sets; (2) the other rates, scored on validation only,
    # a better one replacing the arm's row; (3) the other seeds at the chosen rates. Selection reads
    # validation scores only; a test score never changes a choice.
    chosen: dict[str, float] = {"grpo": p["rl_lr"]}
    selection: dict[str, dict[str, float]] = {arm: {} for arm in a.arms if arm in LRS}
    rows: list[dict[str, Any]] = []
    demo_rl = (p["rl_steps"] * p["rl_tasks_per_step"] * p["rl_group_size"] == a.budget
               and (demo / "rl" / "final").is_dir())

    def select(arm: str, lr: float) -> float:
        s = spec(arm, SELECT_SEED, lr)
        info = train(s)
        v = validation(s["out"] + "/final", work / f"val-{Path(s['out']).name}", p, VAL_TASKS, VAL_SEED)
        selection[arm][f"{lr:g}"] = v
        print(f"select {arm} lr {lr:g}: validation {base_val:.0%} → {v:.0%} "
              f"({info['seconds']:.0f} s, peak RSS {info['peak_rss_mb']:.0f} MB)", flush=True)
        return v

    def report(arm: str, seed: int) -> dict[str, Any]:
        lr = chosen[arm]
        if arm == "grpo" and seed == p["seed"] and demo_rl and lr == p["rl_lr"]:  # the demo's own RL stage
            summary = json.loads((demo / "summary.json").read_text())
            info = {"seconds": summary["seconds"]["rl"], "peak_rss_mb": summary["peak_rss_mb_by_stage"]["rl"],
                    "last": summary.get("rl_last", {}), "from": str(demo / "rl")}
            scores = _evaluate(str(demo / "rl" / "final"), demo / "eval-rl", p, eval_seed)
        else:
            s = spec(arm, seed, lr)
            info = train(s)
            scores = _evaluate(s["out"] + "/final", work / f"test-{Path(s['out']).name}", p, eval_seed)
        row = {"arm": arm, "seed": seed, "lr": lr, **scores, **{f"{k}_delta": scores[k] - base[k] for k in base},
               "train_seconds": info["seconds"], "peak_rss_mb": info["peak_rss_mb"], "last": info["last"]}
        print(f"{arm} seed {seed} lr {lr:g}: fncall {base['fncall']:.0%} → {scores['fncall']:.0%}, BFCL "
              f"{base['bfcl_simple_python']:.0%} → {scores['bfcl_simple_python']:.0%} "
              f"({info['seconds']:.0f} s, peak RSS {info['peak_rss_mb']:.0f} MB)", flush=True)
        return row

    if old:  # only the missing rows, at the rates chosen before
        chosen.update(old["chosen"])
        selection, rows = old["selection"], old["rows"]
        for seed in a.seeds:
            for arm in a.arms:
                if not any(r["arm"] == arm and r["seed"] == seed for r in rows):
                    rows.append(report(arm, seed))
                    save(rows, False)
    best: dict[str, float] = {}
    for arm in (selection if not old else []):  # (1)
        chosen[arm] = LRS[arm][0]
        best[arm] = select(arm, LRS[arm][0])
        save(rows, False)
    for arm in (a.arms if not old else []):
        rows.append(report(arm, SELECT_SEED))
        save(rows, False)
    for arm in (selection if not old else []):  # (2)
        for lr in LRS[arm][1:]:
            v = select(arm, lr)
            if v > best[arm]:  # strictly better on validation; a tie keeps the earlier rate
                best[arm], chosen[arm] = v, lr
                rows = [r for r in rows if not (r["arm"] == arm and r["seed"] == SELECT_SEED)]
                rows.append(report(arm, SELECT_SEED))
            save(rows, False)
    for seed in [x for x in a.seeds if x != SELECT_SEED and not old]:  # (3)
        for arm in a.arms:
            rows.append(report(arm, seed))
            save(rows, False)

    print(f"\nfrom {sft} (fncall {base['fncall']:.0%}, BFCL simple_python {base['bfcl_simple_python']:.0%}), "
          f"{a.budget} rollouts per arm\n")
    print("| arm | lr | fncall held-out (per seed) | BFCL simple_python 0-99 (per seed) | mean Δ fncall | "
          "mean Δ BFCL | train s (per seed) | peak RSS MB |\n|---|---|---|---|---|---|---|---|")
    for arm in a.arms:
        rs = [r for r in rows if r["arm"] == arm]
        per = lambda k: " / ".join(f"{r[k]:.0%}" for r in rs)  # noqa: E731
        mean = lambda k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
        print(f"| {arm} | {chosen[arm]:g} | {per('fncall')} | {per('bfcl_simple_python')} | "
              f"{mean('fncall_delta'):+.1%} | {mean('bfcl_simple_python_delta'):+.1%} | "
              f"{' / '.join(format(r['train_seconds'], '.0f') for r in rs)} | "
              f"{max(r['peak_rss_mb'] for r in rs):.0f} |")
    save(rows, True)
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
