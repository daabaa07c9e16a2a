"""``trajtune demo --model smollm2-135m``: a real pretrained instruct model learns to call tools, on a CPU.

SmolLM2-135M-Instruct ships with a chat template that has no tool support, and out of the box it
answers a function-calling request with prose or Python. The demo:

1. evaluates the base model on held-out ``fncall`` tasks (randomised tool schemas, functions never
   seen in training) and on BFCL ``simple_python`` (the first ``bfcl_limit`` entries);
2. LoRA-fine-tunes it on ``fncall`` expert trajectories that trajtune generates itself — the
   template's missing tool support is bridged by the Hermes tool format, chosen automatically;
3. evaluates again on the same held-out sets.

No BFCL entry is used for training or for choosing anything: BFCL is only ever evaluated. Every
stage goes through the same ``run_sft`` / ``run_eval`` code a user runs, and the run directory
keeps the data, the adapter, every evaluated episode and ``summary.json``.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from trajtune.config import SFTRunConfig
from trajtune.envs.base import make_env
from trajtune.errors import RunDirError, UsageError
from trajtune.progress import bar, console
from trajtune.schema import atomic_write_text, write_trajectories
from trajtune.train import prepare_run_dir, run_sft

# Sized for about 40 minutes on 2 CPU cores (measured: see the README's real-model section).
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
}


def _env_kwargs(p: dict[str, Any]) -> dict[str, Any]:
    # single_turn: the call is the answer (as in BFCL); no system prompt: BFCL sends none either.
    return {"single_turn": True, "system_prompt": False, "holdout": "functions",
            "min_distractors": p["min_distractors"], "max_distractors": p["max_distractors"]}


def _evaluate(model: str, out: Path, p: dict[str, Any], seed: int) -> dict[str, float]:
    """Held-out fncall success and BFCL simple_python accuracy of ``model`` (a dir or alias)."""
    from trajtune.eval.harness import EvalSettings
    from trajtune.eval.run import run_eval

    common = {"model": model, "max_new_tokens": p["max_new_tokens"], "batch_size": p["eval_batch_size"],
              "seed": seed}
    env = run_eval(EvalSettings(env="fncall", env_kwargs=_env_kwargs(p), tasks=p["n_test"], **common),
                   out_dir=out / "fncall")
    bfcl = run_eval(EvalSettings(benchmark="bfcl", categories=["simple_python"], limit=p["bfcl_limit"], **common),
                    out_dir=out / "bfcl")
    return {"fncall": env["metrics"]["success"], "bfcl_simple_python": bfcl["metrics"]["success"]}


def _peak_rss_mb() -> float:
    """Peak resident memory of this process (ru_maxrss is in KiB on Linux)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def run_real_demo(out_dir: str | Path, model: str, *, overwrite: bool = False, seed: int = 0,
                  **overrides: Any) -> dict[str, Any]:
    """Evaluate ``model``, LoRA-SFT it on generated function-calling data, evaluate it again."""
    from trajtune.models.resolve import resolve_model

    t0 = time.time()
    unknown = set(overrides) - set(REAL_DEFAULTS)
    if unknown:
        raise UsageError(f"unknown setting(s) for the real-model demo: {sorted(unknown)}; known: "
                         f"{sorted(REAL_DEFAULTS)}")
    p = {**REAL_DEFAULTS, **{k: v for k, v in overrides.items() if v is not None}}
    existing = Path(out_dir)
    if not overwrite and existing.exists() and any(existing.iterdir()):
        done = "a finished demo" if (existing / "summary.json").exists() else "an unfinished demo or other files"
        raise RunDirError(f"{existing} already holds {done}; pass --overwrite to replace it, or choose another --out")
    console.print(f"preparing {model} (a GGUF is converted once, ~1 min, then cached)", highlight=False)
    base = str(resolve_model(model).path)
    out = prepare_run_dir(out_dir, overwrite=overwrite)
    times: dict[str, float] = {}

    def lap(name: str, start: float) -> None:
        times[name] = round(time.time() - start, 1)

    # 1. Training data: fncall expert trajectories (train split; held-out functions never appear).
    t = time.time()
    env = make_env("fncall", **_env_kwargs(p))
    tasks = env.tasks("train", p["n_train"], seed=seed)
    with bar("expert data", len(tasks)) as adv:
        experts = []
        for task in tasks:
            experts.append(make_env("fncall", **_env_kwargs(p)).expert(task))
            adv()
    data_path = out / "data" / "train.jsonl"
    write_trajectories(data_path, experts)
    lap("data", t)

    # 2. The base model.
    t = time.time()
    summary: dict[str, Any] = {"model": model, "model_path": base, "settings": p, "seed": seed,
                               "before": _evaluate(base, out / "eval-base", p, seed)}
    lap("eval_base", t)

    # 3. LoRA SFT on the generated data (the render tool format resolves to hermes for SmolLM2).
    t = time.time()
    cfg = SFTRunConfig.model_validate({
        "model": {"name_or_path": base, "dtype": "float32",
                  "lora": {"r": p["lora_r"], "alpha": p["lora_alpha"], "target_modules": "all-linear"}},
        "output_dir": str(out / "sft"), "seed": seed,
        "data": {"path": str(data_path), "format": "ir", "max_length": p["max_length"]},
        "train": {"steps": p["sft_steps"], "lr": p["lr"], "batch_size": p["batch_size"],
                  "micro_batch_size": p["batch_size"], "warmup_steps": max(1, p["sft_steps"] // 10)},
    })
    run_sft(cfg)
    lap("sft", t)

    # 4. The fine-tuned model (the adapter directory loads its base model plus the adapter).
    t = time.time()
    summary["after"] = _evaluate(str(out / "sft" / "final"), out / "eval-sft", p, seed)
    lap("eval_sft", t)

    summary["seconds"] = times
    summary["wall_seconds"] = round(time.time() - t0, 1)
    summary["peak_rss_mb"] = _peak_rss_mb()
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1))
    _print_summary(summary, out)
    return summary


def _print_summary(s: dict[str, Any], out: Path) -> None:
    p = s["settings"]
    table = Table(title=f"trajtune real-model demo — {s['model']}")
    table.add_column("held-out set")
    table.add_column("before", justify="right")
    table.add_column("after LoRA SFT", justify="right")
    for label, key in [(f"fncall, {p['n_test']} tasks on unseen functions", "fncall"),
                       (f"BFCL simple_python, first {p['bfcl_limit']}", "bfcl_simple_python")]:
        table.add_row(label, f"{s['before'][key]:.0%}", f"{s['after'][key]:.0%}")
    console.print(table)
    console.print(f"run directory: {out}   wall time: {s['wall_seconds']:.0f} s   peak RSS: {s['peak_rss_mb']:.0f} MB",
                  highlight=False)
