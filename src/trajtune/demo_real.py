"""``trajtune demo --model smollm2-135m``: a real pretrained instruct model learns to call tools, on a CPU.

SmolLM2-135M-Instruct ships with a chat template that has no tool support, and out of the box it
answers a function-calling request with prose or Python. The demo:

1. evaluates the base model on held-out ``fncall`` tasks (randomised tool schemas, functions never
   seen in training) and on BFCL ``simple_python`` (the first ``bfcl_limit`` entries);
2. LoRA-fine-tunes it on ``fncall`` expert trajectories that trajtune generates itself — the
   template's missing tool support is bridged by the Hermes tool format, chosen automatically;
3. evaluates again on the same held-out sets;
4. goes on training the SFT adapter with GRPO on ``fncall`` training tasks (fresh ones, not the SFT
   data's), rewarded by the environment's verifier: the exact verdict plus the call scored by parts
   (format, name, required arguments, types, values; ``fncall.call_terms``), each logged as
   ``reward/NAME``; groups whose samples all score the same teach nothing and are left out;
5. evaluates the RL adapter on the same held-out sets.

No BFCL entry is used for training or for choosing anything: BFCL is only ever evaluated. Every
stage goes through the same ``run_sft`` / ``run_rl`` / ``run_eval`` code a user runs, and the run
directory keeps the data, the adapters, every evaluated episode and ``summary.json``. A killed
demo continues with ``--resume``: finished stages are read back, the others resume.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from trajtune.algorithms.rl import RLRunConfig
from trajtune.algorithms.sft import SFTRunConfig
from trajtune.envs.registry import make_env
from trajtune.errors import RunDirError, UsageError
from trajtune.eval.harness import EvalSettings
from trajtune.eval.run import run_eval
from trajtune.eval.store import RESULTS_FILE
from trajtune.models.resolve import resolve_model
from trajtune.progress import StageClock, bar, console, peak_rss_mb
from trajtune.schema import atomic_write_text, write_trajectories
from trajtune.train import prepare_run_dir, run_rl, run_sft

# The RL stage's reward: the verdict, plus partial credit for the call's parts (ToolRL-style), so a
# group whose calls all fail still tells better calls from worse ones.
DECOMPOSED_REWARD = {"success": 1.0, "info.call_format": 0.1, "info.call_name": 0.1, "info.call_required": 0.1,
                     "info.call_types": 0.1, "info.call_values": 0.2}

# Sized for about 40 minutes on 2 CPU cores (39 measured on a quiet machine: docs/results.md, the
# real-model section).
REAL_DEFAULTS: dict[str, Any] = {
    "n_train": 400,  # fncall expert trajectories (single call per request, the BFCL shape)
    "n_test": 50,  # held-out fncall tasks, on functions kept out of training
    "bfcl_limit": 100,  # the first entries of BFCL simple_python
    "min_distractors": 0,
    "max_distractors": 2,
    "sft_steps": 80,
    "batch_size": 4,
    "lr": 3e-4,
    "lora_r": 16,
    "lora_alpha": 32,
    "max_length": 768,
    "max_new_tokens": 96,
    "eval_batch_size": 16,
    "rl_steps": 16,  # 0: no RL stage
    "rl_tasks_per_step": 4,
    "rl_group_size": 8,
    "rl_lr": 5e-5,
    "rl_temperature": 1.0,
    "rl_reward": "decomposed",  # or "verdict": 1 for the right call, else 0
    "rl_max_new_tokens": 96,
}


def _env_kwargs(p: dict[str, Any]) -> dict[str, Any]:
    # single_turn: the call is the answer (as in BFCL); no system prompt: BFCL sends none either.
    return {"single_turn": True, "system_prompt": False, "holdout": "functions",
            "min_distractors": p["min_distractors"], "max_distractors": p["max_distractors"]}


def _eval_once(settings: Any, out: Path) -> dict[str, Any]:
    """An evaluation, or the finished one already in ``out`` (a resumed demo); a killed one resumes."""
    if (out / RESULTS_FILE).exists():
        return json.loads((out / RESULTS_FILE).read_text())  # type: ignore[no-any-return]
    return run_eval(settings, out_dir=out, resume=out.exists())


def _evaluate(model: str, out: Path, p: dict[str, Any], seed: int) -> dict[str, float]:
    """Held-out fncall success and BFCL simple_python accuracy of ``model`` (a dir or alias)."""
    common = {"model": model, "max_new_tokens": p["max_new_tokens"], "batch_size": p["eval_batch_size"],
              "seed": seed}
    env = _eval_once(EvalSettings(env="fncall", env_kwargs=_env_kwargs(p), tasks=p["n_test"], **common),
                     out / "fncall")
    bfcl = _eval_once(EvalSettings(benchmark="bfcl", categories=["simple_python"], limit=p["bfcl_limit"], **common),
                      out / "bfcl")
    return {"fncall": env["metrics"]["success"], "bfcl_simple_python": bfcl["metrics"]["success"]}


def rl_config(out: Path, p: dict[str, Any], seed: int) -> RLRunConfig:
    """GRPO on fncall training tasks, continuing the SFT adapter (its saved weights are the step-0 policy)."""
    if p["rl_reward"] not in ("decomposed", "verdict"):
        raise UsageError(f"rl_reward must be decomposed or verdict, not {p['rl_reward']!r}")
    terms = DECOMPOSED_REWARD if p["rl_reward"] == "decomposed" else {"success": 1.0}
    # fresh training tasks: the RL run draws from a seed the SFT data (seed) did not use
    env = {"name": "fncall", "kwargs": _env_kwargs(p)}
    return RLRunConfig.model_validate({
        "model": {"name_or_path": str(out / "sft" / "final"), "dtype": "float32"},
        "output_dir": str(out / "rl"), "seed": seed + 1000, "env": env, "report": False,
        "rollout": {"max_turns": 1, "max_new_tokens": p["rl_max_new_tokens"], "max_length": p["max_length"],
                    "temperature": p["rl_temperature"], "batch_size": p["rl_tasks_per_step"] * p["rl_group_size"]},
        "rl": {"estimator": "grpo", "tasks_per_step": p["rl_tasks_per_step"], "group_size": p["rl_group_size"],
               "n_train_tasks": p["rl_steps"] * p["rl_tasks_per_step"], "drop_equal_groups": True,
               "reward": {"terms": terms}},
        "train": {"steps": p["rl_steps"], "lr": p["rl_lr"], "schedule": "constant", "warmup_steps": 0,
                  "micro_batch_size": p["rl_group_size"], "save_every": max(1, p["rl_steps"] // 4) if p["rl_steps"] > 1 else 0},
    })


def _settings_match(out: Path, p: dict[str, Any]) -> None:
    """A resumed demo must be the same demo: a recorded setting with another value is refused (a setting
    the run did not record, added by a newer trajtune, is accepted)."""
    path = out / "demo_settings.json"
    recorded = None
    if path.exists():
        recorded = json.loads(path.read_text())
    elif (out / "summary.json").exists():  # a demo of an earlier trajtune, which recorded its settings there
        old = json.loads((out / "summary.json").read_text())
        recorded = {**old.get("settings", {}), "seed": old.get("seed")}
    if recorded is None:
        raise RunDirError(f"{out} holds no real-model demo to resume (no demo_settings.json); choose another --out")
    diff = {k: (v, p[k]) for k, v in recorded.items() if k in p and p[k] != v}
    if diff:
        shown = ", ".join(f"{k}: {a} → {b}" for k, (a, b) in diff.items())
        raise UsageError(f"{out} was started with other settings ({shown}); resume with the same ones, or use "
                         "--overwrite or another --out")


def _demo_settings(overrides: dict[str, Any], overwrite: bool, resume: bool) -> dict[str, Any]:
    """The demo's settings: the defaults with the given overrides, refusing unknown names and
    contradicting flags before anything is loaded."""
    unknown = set(overrides) - set(REAL_DEFAULTS)
    if unknown:
        raise UsageError(f"unknown setting(s) for the real-model demo: {sorted(unknown)}; known: "
                         f"{sorted(REAL_DEFAULTS)}")
    if overwrite and resume:
        raise UsageError("--overwrite and --resume contradict each other: choose one")
    return {**REAL_DEFAULTS, **{k: v for k, v in overrides.items() if v is not None}}


def _check_out_dir(existing: Path, p: dict[str, Any], seed: int, overwrite: bool, resume: bool) -> None:
    """A resumed demo must be the same demo; a new one must not land on another run's files."""
    if resume:
        _settings_match(existing, {**p, "seed": seed})
    elif not overwrite and existing.exists() and any(existing.iterdir()):
        done = "a finished demo" if (existing / "summary.json").exists() else "an unfinished demo or other files"
        raise RunDirError(f"{existing} already holds {done}; pass --overwrite to replace it, --resume to continue "
                          "an unfinished one, or choose another --out")


def _expert_data(out: Path, p: dict[str, Any], seed: int) -> Path:
    """fncall expert trajectories on the train split (held-out functions never appear); written once,
    so a resumed demo reuses them."""
    data_path = out / "data" / "train.jsonl"
    if not data_path.exists():
        env = make_env("fncall", **_env_kwargs(p))
        tasks = env.tasks("train", p["n_train"], seed=seed)
        with bar("expert data", len(tasks)) as adv:
            experts = []
            for task in tasks:
                experts.append(make_env("fncall", **_env_kwargs(p)).expert(task))
                adv()
        write_trajectories(data_path, experts)
    return data_path


def _sft_config(base: str, out: Path, data_path: Path, p: dict[str, Any], seed: int) -> SFTRunConfig:
    """LoRA SFT on the generated data (the render tool format resolves to hermes for SmolLM2)."""
    return SFTRunConfig.model_validate({
        "model": {"name_or_path": base, "dtype": "float32",
                  "lora": {"r": p["lora_r"], "alpha": p["lora_alpha"], "target_modules": "all-linear"}},
        "output_dir": str(out / "sft"), "seed": seed,
        "data": {"path": str(data_path), "format": "ir", "max_length": p["max_length"]},
        "train": {"steps": p["sft_steps"], "lr": p["lr"], "batch_size": p["batch_size"],
                  "micro_batch_size": p["batch_size"], "warmup_steps": max(1, p["sft_steps"] // 10)},
    })


def run_real_demo(out_dir: str | Path, model: str, *, overwrite: bool = False, resume: bool = False, seed: int = 0,
                  **overrides: Any) -> dict[str, Any]:
    """Evaluate ``model``, LoRA-SFT it on generated function-calling data, GRPO it, evaluate each stage."""
    t0 = time.time()
    p = _demo_settings(overrides, overwrite, resume)
    existing = Path(out_dir)
    resume = resume and existing.exists()
    _check_out_dir(existing, p, seed, overwrite, resume)
    console.print(f"preparing {model} (a GGUF is converted once, ~1 min, then cached)", highlight=False)
    base = str(resolve_model(model).path)
    out = existing if resume else prepare_run_dir(out_dir, overwrite=overwrite)
    if not (out / "demo_settings.json").exists():
        atomic_write_text(out / "demo_settings.json", json.dumps({**p, "seed": seed}, indent=1))
    stage = StageClock()

    with stage("data"):  # 1. training data
        data_path = _expert_data(out, p, seed)
    with stage("eval_base"):  # 2. the base model
        summary: dict[str, Any] = {"model": model, "model_path": base, "settings": p, "seed": seed,
                                   "before": _evaluate(base, out / "eval-base", p, seed)}
    with stage("sft"):  # 3. LoRA SFT on the generated data
        run_sft(_sft_config(base, out, data_path, p, seed), resume=resume and (out / "sft").exists())
    with stage("eval_sft"):  # 4. the fine-tuned model (the adapter directory loads its base plus the adapter)
        summary["after"] = _evaluate(str(out / "sft" / "final"), out / "eval-sft", p, seed)
    if p["rl_steps"] > 0:  # 5. GRPO from the SFT adapter on fncall training tasks, then the same held-out sets
        with stage("rl"):
            rl = run_rl(rl_config(out, p, seed), resume=resume and (out / "rl").exists())
            summary["rl_last"] = rl.get("last", {})
        with stage("eval_rl"):
            summary["after_rl"] = _evaluate(str(out / "rl" / "final"), out / "eval-rl", p, seed)

    summary["seconds"] = stage.times
    summary["peak_rss_mb_by_stage"] = stage.peak
    summary["wall_seconds"] = round(time.time() - t0, 1)
    summary["peak_rss_mb"] = peak_rss_mb()
    if resume:
        summary["resumed"] = True  # times are of this invocation: stages read back took ~0 s
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1))
    _print_summary(summary, out)
    return summary


def _print_summary(s: dict[str, Any], out: Path) -> None:
    p = s["settings"]
    rl = "after_rl" in s
    table = Table(title=f"trajtune real-model demo — {s['model']}")
    table.add_column("held-out set")
    table.add_column("before", justify="right")
    table.add_column("after LoRA SFT", justify="right")
    if rl:
        table.add_column(f"after + GRPO ({p['rl_steps']} steps)", justify="right")
    for label, key in [(f"fncall, {p['n_test']} tasks on unseen functions", "fncall"),
                       (f"BFCL simple_python, first {p['bfcl_limit']}", "bfcl_simple_python")]:
        row = [label, f"{s['before'][key]:.0%}", f"{s['after'][key]:.0%}"]
        table.add_row(*row, *([f"{s['after_rl'][key]:.0%}"] if rl else []))
    console.print(table)
    console.print(f"run directory: {out}   wall time: {s['wall_seconds']:.0f} s   peak RSS: {s['peak_rss_mb']:.0f} MB",
                  highlight=False)
