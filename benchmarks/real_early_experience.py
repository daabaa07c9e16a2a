"""Early experience (Zhang et al., Meta, 2025) against SFT on the same expert data, on a real model.

SmolLM2-135M-Instruct on ``fncall`` (functions held out of training), LoRA as the real demo trains
it (r 16, lr 3e-4, batches of 4). Per seed:

1. ``--n-expert`` expert trajectories of ``fncall`` training tasks in the environment's multi-turn
   form (the call, its result, a short answer), so that a wrong call has an outcome to learn from:
   the environment's ``Error: ...`` message naming what was wrong;
2. a weak start: LoRA SFT of the base model on them for ``--start-steps`` steps (the policy must be
   able to propose calls at all: the base model answers 48 of 50 requests in prose);
3. from that adapter, each arm trains ``--steps`` more steps at the same rate and batch:

   - ``sft``: the expert trajectories only;
   - ``ee_both``: ``rft`` with ``k: 0`` and ``early_experience`` (world model and reflection): at the
     call state of every expert trajectory the start policy samples ``--alternatives`` calls of its
     own at temperature 1 (one equal to the expert's is dropped), the environment executes them, and
     predicting each outcome (the result, or the error) trains beside the expert data, as does the
     policy's own explanation of why the expert's call beats its own, followed by the expert's call;
   - ``ee_world``: the same without the reflection records: ``sft`` on the expert trajectories and
     the world-model records that ``ee_both`` mined (the mining is seeded, so mining again would
     sample the same alternatives; reading them back saves its ~13 minutes);
   - ``ee_world_epoch``: ``ee_world``'s data for one epoch (its rows ÷ the batch, rounded up, in
     place of ``--steps``). At ``--steps`` (60 × 4 = 240 rows: one epoch of ``sft``'s 240 expert
     trajectories) the EE arms see each expert row about a third as often as ``sft``; here as often,
     at about 3.4 times the steps.

Scored greedily, single call (the BFCL shape, as the demo scores): **in-domain**, 50 ``fncall``
training-split tasks of seed + 500 (functions seen in training, tasks no run trained on); **held-out
tool schemas**, the demo's 50 held-out ``fncall`` tasks (functions never seen in training) and BFCL
``simple_python`` entries 0-99 (evaluated only, never trained on or used for a choice). Nothing is
tuned per arm: the rate is the demo's SFT rate.

    OMP_NUM_THREADS=1 python benchmarks/real_early_experience.py --seed 0 --out runs/real-ee-s0   # and 1
    python benchmarks/real_early_experience.py --table runs/real-ee-s0 runs/real-ee-s1

Finished runs and evaluations are read back, so a killed run continues. ``--table`` prints the rows
and writes ``benchmarks/results/real_early_experience.json``. A benchmark, not a test: it asserts
nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _child_jobs import measured, run_child  # benchmarks/ is on sys.path when this script runs

RESULTS = Path(__file__).parent / "results" / "real_early_experience.json"
ARMS: dict[str, dict[str, Any] | None] = {
    "sft": None,
    "ee_both": {"world_model": True, "reflection": True, "states": 1},
    "ee_world": None,  # SFT on the expert data and ee_both's world-model records (the same mining)
    "ee_world_epoch": None,  # the same data for one epoch: each expert row as often as in sft
}
IN_DOMAIN_TASKS, IN_DOMAIN_SEED_OFFSET = 50, 500


def _settings(a: argparse.Namespace) -> dict[str, Any]:
    from trajtune.demo_real import REAL_DEFAULTS

    return {**REAL_DEFAULTS, "seed": a.seed, "n_expert": a.n_expert, "start_steps": a.start_steps,
            "steps": a.steps, "alternatives": a.alternatives, "temperature": a.temperature, "model": a.model}


def _env(p: dict[str, Any]) -> dict[str, Any]:
    """The demo's fncall options, but multi-turn: a call is answered (result or error)."""
    from trajtune.demo_real import _env_kwargs

    return {"name": "fncall", "kwargs": {**_env_kwargs(p), "single_turn": False}}


def _expert_data(p: dict[str, Any], path: Path) -> None:
    from trajtune.envs import make_env
    from trajtune.envs.expert_data import write_expert_data

    if not path.exists():
        kwargs = _env(p)["kwargs"]
        write_expert_data("fncall", kwargs, make_env("fncall", **kwargs).tasks("train", p["n_expert"], seed=p["seed"]),
                          path)


def _world_model_data(work: Path) -> None:
    """``ee_world``'s data: the expert trajectories followed by the world-model records of ``ee_both``'s mining."""
    mined = work / "ee_both" / "rft" / "iter-000.jsonl"
    if not mined.exists():
        raise SystemExit(f"{mined} is missing: ee_world trains on ee_both's world-model records; run ee_both first")
    path = work / "ee_world_data.jsonl"
    wm = [line for line in mined.read_text().splitlines()
          if json.loads(line)["metadata"].get("early_experience") == "world_model"]
    path.write_text((work / "expert.jsonl").read_text() + "\n".join(wm) + "\n")


def config(arm: str, p: dict[str, Any], work: Path) -> Any:
    """``start``: LoRA SFT of the base model; an arm: the start adapter trained on (expert +) records."""
    from trajtune.algorithms.registry import get_algorithm
    from trajtune.models.resolve import resolve_model

    start = arm == "start"
    model: dict[str, Any] = {"name_or_path": str(work / "start" / "final"), "dtype": "float32"}
    if start:
        model = {"name_or_path": str(resolve_model(p["model"]).path), "dtype": "float32",
                 "lora": {"r": p["lora_r"], "alpha": p["lora_alpha"], "target_modules": "all-linear"}}
    data = work / ("ee_world_data.jsonl" if arm.startswith("ee_world") else "expert.jsonl")
    steps = p["start_steps"] if start else p["steps"]
    if arm == "ee_world_epoch":
        steps = -(-len(data.read_text().splitlines()) // p["batch_size"])
    spec: dict[str, Any] = {
        "model": model, "output_dir": str(work / arm), "seed": p["seed"], "report": False,
        "data": {"path": str(data), "format": "ir", "max_length": p["max_length"]},
        "train": {"steps": steps, "lr": p["lr"], "batch_size": p["batch_size"], "micro_batch_size": p["batch_size"],
                  "warmup_steps": 2, "schedule": "constant"}}
    ee = None if start else ARMS[arm]
    if ee is None:
        spec["algorithm"] = "sft"
    else:
        spec.update({"algorithm": "rft", "env": _env(p),
                     "rollout": {"max_turns": 2, "max_new_tokens": p["max_new_tokens"], "max_length": p["max_length"],
                                 "temperature": p["temperature"], "batch_size": 32},
                     "rft": {"k": 0, "iterations": 1, "n_tasks": p["n_expert"],
                             "early_experience": {**ee, "alternatives": p["alternatives"]}}})
    return get_algorithm(spec["algorithm"]).config.model_validate(spec)


def _job(spec: dict[str, Any]) -> dict[str, Any]:
    """One training run in this (child) process: its wall time, its own peak RSS, what it mined."""
    from early_experience import _mined  # benchmarks/ is on sys.path when this script runs

    from trajtune.train import run

    out = Path(spec["work"]) / spec["arm"]
    _, cost = measured(lambda: run(config(spec["arm"], spec["p"], Path(spec["work"])), resume=out.exists(),
                                   quiet=True))
    return {**cost, "mined": _mined(out)}


def train(arm: str, p: dict[str, Any], work: Path) -> dict[str, Any]:
    done = work / arm / "bench.json"
    if arm.startswith("ee_world") and not done.exists():
        _world_model_data(work)
    return run_child(__file__, {"arm": arm, "p": p, "work": str(work)}, done, f"{arm} (seed {p['seed']})")


def scores(model: Path, p: dict[str, Any], work: Path, name: str) -> dict[str, float]:
    from real_rl_choice import validation  # benchmarks/ is on sys.path when this script runs

    from trajtune.demo_real import _evaluate

    t = time.time()
    s = {"in_domain": validation(str(model), work / f"eval-{name}" / "in-domain", p, IN_DOMAIN_TASKS,
                                 p["seed"] + IN_DOMAIN_SEED_OFFSET),
         **_evaluate(str(model), work / f"eval-{name}", p, p["seed"])}
    return {**s, "eval_seconds": round(time.time() - t, 1)}


def run_seed(a: argparse.Namespace) -> None:
    work = Path(a.out)
    p = _settings(a)
    saved = work / "settings.json"
    if saved.exists() and json.loads(saved.read_text()) != p:
        raise SystemExit(f"{work} was started with other settings ({saved}); use the same ones or another --out")
    work.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(p, indent=1))
    _expert_data(p, work / "expert.jsonl")
    summary_path = work / "summary.json"
    summary: dict[str, Any] = json.loads(summary_path.read_text()) if summary_path.exists() else {"rows": {}}
    summary["settings"] = p

    def record(name: str, row: dict[str, Any]) -> None:
        summary["rows"][name] = row
        summary_path.write_text(json.dumps(summary, indent=1))
        shown = ", ".join(f"{k} {row[k]:.0%}" for k in ("in_domain", "fncall", "bfcl_simple_python"))
        print(f"seed {p['seed']} {name}: {shown} (train {row.get('seconds', 0):.0f} s, peak RSS "
              f"{row.get('peak_rss_mb', 0):.0f} MB) {row.get('mined', '')}", flush=True)

    start = train("start", p, work)
    # the comparison first, so that a short session still gets it; the start's own scores last
    for arm in [x for x in ARMS if x in a.arms]:
        if arm not in summary["rows"]:
            info = train(arm, p, work)
            record(arm, {**info, **scores(work / arm / "final", p, work, arm)})
    if "start" not in summary["rows"]:
        record("start", {**start, **scores(work / "start" / "final", p, work, "start")})


def _failures(dirs: list[Path], names: list[str]) -> list[dict[str, Any]]:
    """Why each held-out failure failed, per arm: BFCL's checker reason, fncall's verdict
    (``real_failures.py``'s classes: ``not parsed`` is a call the parser could not read)."""
    from real_failures import _episodes, bfcl_reason, fncall_reasons

    out = []
    for d in dirs:
        p = json.loads((d / "summary.json").read_text())["settings"]
        per: dict[str, Any] = {"seed": p["seed"], "bfcl": {}, "fncall": {}}
        for n in names:
            bfcl = _episodes(d / f"eval-{n}" / "bfcl" / "episodes.jsonl")
            per["bfcl"][n] = dict(Counter(r for r in map(bfcl_reason, bfcl) if r is not None))
            per["fncall"][n] = dict(fncall_reasons(d, f"eval-{n}", p, p["seed"]))
        out.append(per)
    return out


def table(dirs: list[str]) -> None:
    runs = [json.loads((Path(d) / "summary.json").read_text()) for d in dirs]
    names = [x for x in ["start", *ARMS] if all(x in r["rows"] for r in runs)]
    keys = {"in_domain": "in-domain fncall (50)", "fncall": "held-out fncall (50)",
            "bfcl_simple_python": "BFCL simple_python 0-99"}
    seeds = " / ".join(str(r["settings"]["seed"]) for r in runs)
    print(f"| arm, seeds {seeds} | " + " | ".join(keys.values()) + " | train s | peak RSS MB |")
    print("|---" * (len(keys) + 3) + "|")
    for n in names:
        rows = [r["rows"][n] for r in runs]
        cells = [" / ".join(f"{x[k]:.0%}" for x in rows) for k in keys]
        print(f"| {n} | " + " | ".join(cells) + f" | {' / '.join(format(x['seconds'], '.0f') for x in rows)} | "
              f"{max(x['peak_rss_mb'] for x in rows):.0f} |")
    failures = _failures([Path(d) for d in dirs], names)
    for kind in ("bfcl", "fncall"):
        classes = sorted({c for per in failures for arm in per[kind].values() for c in arm},
                         key=lambda c: -sum(arm.get(c, 0) for per in failures for arm in per[kind].values()))
        print(f"\n| {kind} failure class, seeds {seeds} | " + " | ".join(names) + " |\n" + "|---" * (len(names) + 1)
              + "|")
        for c in classes:
            print(f"| {c} | " + " | ".join(" / ".join(str(per[kind][n].get(c, 0)) for per in failures)
                                          for n in names) + " |")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"runs": runs, "failures": failures}, indent=1) + "\n")
    print(f"wrote {RESULTS}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0, help="task draw, held-out sets and training order")
    ap.add_argument("--out", default="runs/real-ee-s0", help="work directory (finished parts are reused)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--n-expert", type=int, default=240, help="expert trajectories (fncall training tasks)")
    ap.add_argument("--start-steps", type=int, default=20, help="LoRA SFT steps of the weak start")
    ap.add_argument("--steps", type=int, default=60, help="steps of each arm after the start")
    ap.add_argument("--alternatives", type=int, default=2, help="the policy's own calls per expert state")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the alternatives")
    ap.add_argument("--table", nargs="+", metavar="DIR", help="print the table of finished seed directories")
    ap.add_argument("--job", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.job:
        print(json.dumps(_job(json.loads(a.job))), flush=True)
    elif a.table:
        table(a.table)
    else:
        run_seed(a)


if __name__ == "__main__":
    main()
