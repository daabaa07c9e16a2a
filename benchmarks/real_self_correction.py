"""Trained self-correction on a real model: SmolLM2-135M after a failed call, two ways.

From a finished real-model demo's SFT adapter (``trajtune demo --model smollm2-135m``), GRPO trains
only the turns that follow a failed attempt. Episodes come from the ``retry`` wrapper around
``fncall`` training tasks (fresh ones, seeded ``seed + 2000``; binary feedback "Your answer was not
correct", a reflection turn, one retry); the reward is the last attempt's verdict, and episodes solved
at the first attempt are masked. Two arms (``--arms``), each its own run from the same adapter:

- ``reflection`` (Reflect, Retry, Reward, 2025): only the reflection's tokens train
  (``rl.train_turns: reflection``);
- ``retry`` (RISE-like): only the retried attempt's tokens train (``rl.train_turns: retry``).

The learning rate is the demo's GRPO rate (chosen on validation tasks for plain GRPO,
``benchmarks/real_rl_choice.py``), not tuned for these objectives.

Before and after, greedily, on the demo's held-out sets (never trained on, never used to choose):

- ``fncall``: the demo's 50 held-out tasks (functions never seen in training), through ``retry``:
  first-attempt success, success after reflection and retry;
- BFCL ``simple_python`` entries 0–99 through ``retry`` around ``bfcl_single_turn`` (BFCL's own AST
  checker decides both attempts);
- recovery after an injected tool error: the same 50 ``fncall`` tasks, the first call answered with
  a transient error (``inject_error: 1``, no retry), success = the agent calls again, correctly.

    OMP_NUM_THREADS=1 python benchmarks/real_self_correction.py --demo runs/real64-s0 --out runs/selfcorr-s0
    python benchmarks/real_self_correction.py --table runs/selfcorr-s0 runs/selfcorr-s1

The seed is the demo's (its held-out draw); finished stages are read back, so a killed run continues.
Writes ``summary.json`` in ``--out``; ``--table`` prints the rows and writes
``benchmarks/results/real_self_correction.json``. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "real_self_correction.json"
MAX_LENGTH = 1024  # prompt (~420 tokens) + call + feedback + reflection + retry


def _evals(model: str, out: Path, p: dict[str, Any], seed: int) -> dict[str, Any]:
    from trajtune.demo_real import _env_kwargs, _eval_once
    from trajtune.eval.harness import EvalSettings

    common = {"model": model, "max_new_tokens": p["max_new_tokens"], "batch_size": p["eval_batch_size"],
              "seed": seed, "max_length": MAX_LENGTH}
    fncall = {"env": "fncall", "kwargs": _env_kwargs(p)}
    runs = {
        "fncall": EvalSettings(env="retry", env_kwargs=fncall, tasks=p["n_test"], **common),
        "bfcl": EvalSettings(env="retry", env_kwargs={"env": "bfcl_single_turn", "kwargs": {
            "categories": "simple_python", "limit": p["bfcl_limit"]}}, tasks=p["bfcl_limit"], **{**common, "seed": 0}),
        "fncall_error": EvalSettings(env="retry", env_kwargs={**fncall, "retries": 0, "inject_error": 1.0},
                                     tasks=p["n_test"], **common),
    }
    out_m: dict[str, Any] = {}
    for name, s in runs.items():
        t0 = time.time()
        r = _eval_once(s, out / name)["metrics"]
        out_m[name] = {"first": r["retry"]["first_attempt_success"], "final": r["success"],
                       "recovered": r["retry"]["recovered"], "retried": r["retry"]["retried"],
                       "recovery_after_error": r["retry"].get("recovery_after_error"),
                       "seconds": round(time.time() - t0, 1)}
    return out_m


def rl_config(demo: Path, out: Path, p: dict[str, Any], seed: int, steps: int, lr: float, arm: str) -> Any:
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.demo_real import _env_kwargs

    return RLRunConfig.model_validate({
        "model": {"name_or_path": str(demo / "sft" / "final"), "dtype": "float32"},
        "output_dir": str(out / f"rl-{arm}"), "seed": seed + 2000, "report": False,
        "env": {"name": "retry", "kwargs": {"env": "fncall", "kwargs": _env_kwargs(p)}},
        "rollout": {"max_turns": 3, "max_new_tokens": p["rl_max_new_tokens"], "max_length": MAX_LENGTH,
                    "temperature": p["rl_temperature"], "batch_size": p["rl_tasks_per_step"] * p["rl_group_size"]},
        "rl": {"estimator": "grpo", "tasks_per_step": p["rl_tasks_per_step"], "group_size": p["rl_group_size"],
               "n_train_tasks": steps * p["rl_tasks_per_step"], "drop_equal_groups": True,
               "train_turns": arm},
        "train": {"steps": steps, "lr": lr, "schedule": "constant", "warmup_steps": 0,
                  "micro_batch_size": p["rl_group_size"], "save_every": max(1, steps // 4) if steps > 1 else 0},
    })


def run(demo: Path, out: Path, steps: int, lr: float, limit: int | None, arms: list[str]) -> dict[str, Any]:
    from trajtune.progress import StageClock
    from trajtune.schema import atomic_write_text
    from trajtune.train import run_rl

    p = json.loads((demo / "demo_settings.json").read_text())
    seed = int(p["seed"])
    if limit:  # a smoke run
        p = {**p, "n_test": limit, "bfcl_limit": limit}
    out.mkdir(parents=True, exist_ok=True)
    path = out / "summary.json"
    summary: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    summary.update({"demo": str(demo), "seed": seed, "steps": steps, "lr": lr, "settings": p})
    clock = StageClock()
    with clock("eval_sft"):
        summary["sft"] = _evals(str(demo / "sft" / "final"), out / "eval-sft", p, seed)
    for arm in arms:
        with clock(f"rl_{arm}"):
            run_rl(rl_config(demo, out, p, seed, steps, lr, arm), resume=(out / f"rl-{arm}").exists())
        with clock(f"eval_{arm}"):
            summary[arm] = _evals(str(out / f"rl-{arm}" / "final"), out / f"eval-{arm}", p, seed)
        metrics = [json.loads(x) for x in (out / f"rl-{arm}" / "metrics.jsonl").read_text().splitlines()]
        summary[f"training_{arm}"] = [{k: r.get(k) for k in ("step", "success", "first_attempt_success",
                                                             f"{arm}/episodes", f"{arm}/success", "loss")}
                                      for r in metrics if "success" in r]
    summary.setdefault("seconds", {}).update(clock.times)
    summary.setdefault("peak_rss_mb_by_stage", {}).update(clock.peak)
    atomic_write_text(path, json.dumps(summary, indent=1))
    return summary


def behaviour(episodes_file: Path) -> dict[str, Any]:
    """What the model does after a failed attempt: how many reflections are text (not a call), and how
    many retries repeat the failed first attempt exactly."""
    from trajtune.algorithms.actions import action_key
    from trajtune.schema import Trajectory

    reflections = text = retries = repeats = 0
    for line in episodes_file.read_text().splitlines():
        t = Trajectory.model_validate_json(line)
        acts = [m for m in t.messages if m.role == "assistant"]
        marks = [i for i, m in enumerate(t.messages) if m.extra.get("retry") == "reflect"]
        if not marks:
            continue
        reflection = next((m for m in t.messages[marks[0]:] if m.role == "assistant"), None)
        if reflection is not None:
            reflections += 1
            text += int(not reflection.tool_calls and not reflection.extra.get("parse_errors"))
        if len(acts) >= 3:
            retries += 1
            repeats += int(action_key(acts[-1]) == action_key(acts[0]))
    return {"reflections": reflections, "text_reflections": text, "retries": retries, "repeated_first": repeats}


def table(dirs: list[Path]) -> None:
    runs = [json.loads((d / "summary.json").read_text()) for d in dirs]
    for d, r in zip(dirs, runs):
        r["behaviour"] = {stage: {key: behaviour(d / f"eval-{stage}" / key / "episodes.jsonl") for key in ("fncall", "bfcl")}
                          for stage in ("sft", "reflection", "retry") if (d / f"eval-{stage}").is_dir()}
    stages = ["sft"] + [a for a in ("reflection", "retry") if all(a in r for r in runs)]
    rows = []
    for key, label in (("fncall", "held-out fncall: 1st -> 2nd"), ("bfcl", "BFCL simple_python: 1st -> 2nd")):
        for stage in stages:
            rows.append((label, stage, [f"{r[stage][key]['first']:.0%} -> {r[stage][key]['final']:.0%}" for r in runs]))
    for stage in stages:
        rows.append(("fncall, injected tool error", stage,
                     [f"{r[stage]['fncall_error']['recovery_after_error']:.0%}" for r in runs]))
    for key in ("fncall", "bfcl"):
        for stage in stages:
            b = [r["behaviour"][stage][key] for r in runs]
            rows.append((f"{key}: text reflections / repeats", stage,
                         [f"{x['text_reflections']}/{x['reflections']}, {x['repeated_first']}/{x['retries']}" for x in b]))
    print(f"{'set':34} {'model':10} " + "  ".join(f"seed {r['seed']:<14}" for r in runs))
    for label, stage, cells in rows:
        print(f"{label:34} {stage:10} " + "  ".join(f"{c:19}" for c in cells))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"runs": runs}, indent=1))
    print(f"wrote {RESULTS}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", type=Path, help="a finished real-model demo directory (its sft/final is the start)")
    ap.add_argument("--out", type=Path, help="work directory (resumable)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--limit", type=int, default=None, help="smoke run: this many held-out tasks per set")
    ap.add_argument("--arms", nargs="+", default=["reflection", "retry"], choices=["reflection", "retry"],
                    help="rl.train_turns of each arm: reflection (Reflect, Retry, Reward) and/or retry (RISE-like)")
    ap.add_argument("--table", type=Path, nargs="+", help="print the table of finished work directories")
    a = ap.parse_args()
    if a.table:
        table(a.table)
        return
    if a.demo is None or a.out is None:
        ap.error("--demo and --out are required (or --table)")
    s = run(a.demo, a.out, a.steps, a.lr, a.limit, a.arms)
    print(json.dumps({k: s[k] for k in ("sft", *a.arms, "seconds")}, indent=1))


if __name__ == "__main__":
    main()
