"""Does SFT on environments generated from tool specs transfer to unseen function-calling schemas?

SmolLM2-135M-Instruct is LoRA-fine-tuned on scripted-expert trajectories of the five environments
that ``trajtune envs generate`` makes from the shipped example specs (petstore and library:
OpenAPI; calendar: OpenAI tools; notes: an MCP tool list; crm: bare functions), all multi-turn
(look the record up, then write, then answer). Nothing of ``fncall`` or BFCL is in the data. It
is scored before and after, greedily:

- in domain: held-out test tasks of the same five generated environments (new records and goals);
- transfer: the real demo's held-out ``fncall`` tasks (functions kept out of every fncall
  training split, single call) and BFCL ``simple_python`` entries 0-99 (evaluated only, never
  trained on or used to choose anything).

The SFT settings are the real demo's (``trajtune.demo_real.REAL_DEFAULTS``: 80 steps of 4, lr
3e-4, LoRA r 16), chosen before this benchmark and not tuned on it, so the row compares with the
demo's SFT on ``fncall`` data at the same budget.

    OMP_NUM_THREADS=1 python benchmarks/spec_env_transfer.py --seed S --out runs/spec-transfer-sS   # S = 0, 1
    python benchmarks/spec_env_transfer.py --collect runs/spec-transfer-s0 runs/spec-transfer-s1

The first form runs one seed (a killed run continues: finished stages are read back); the second
prints the table and writes ``benchmarks/results/spec_env_transfer.json``. A benchmark, not a
test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

SPECS = ("petstore", "library", "calendar", "notes", "crm")
PER_SPEC_TRAIN = 80  # 400 trajectories, as many as the real demo's fncall SFT data
PER_SPEC_TEST = 10
MAX_LENGTH = 1024  # the generated worlds' multi-turn episodes are longer than a single fncall call


def _data(out: Path, seed: int) -> Path:
    from trajtune.envs.registry import make_env
    from trajtune.schema import write_trajectories

    path = out / "data" / "train.jsonl"
    if not path.exists():
        trajs = []
        for spec in SPECS:
            env = make_env("spec", path=spec)
            trajs += [make_env("spec", path=spec).expert(t) for t in env.tasks("train", PER_SPEC_TRAIN, seed=seed)]
        write_trajectories(path, trajs)
    return path


def _in_domain(model: str, out: Path, seed: int) -> float:
    from trajtune.demo_real import _eval_once
    from trajtune.eval.harness import EvalSettings

    wins = 0
    for spec in SPECS:
        res = _eval_once(EvalSettings(model=model, env="spec", env_kwargs={"path": spec}, tasks=PER_SPEC_TEST,
                                      seed=seed, max_new_tokens=96, max_length=MAX_LENGTH, batch_size=10),
                         out / f"spec-{spec}")
        wins += round(res["metrics"]["success"] * PER_SPEC_TEST)
    return wins / (PER_SPEC_TEST * len(SPECS))


def run(seed: int, out: Path) -> dict[str, Any]:
    from trajtune.demo_real import REAL_DEFAULTS, _evaluate, _sft_config
    from trajtune.models.resolve import resolve_model
    from trajtune.progress import StageClock
    from trajtune.schema import atomic_write_text
    from trajtune.train import run_sft

    out.mkdir(parents=True, exist_ok=True)
    p = {**REAL_DEFAULTS, "max_length": MAX_LENGTH}
    base = str(resolve_model("smollm2-135m").path)
    stage = StageClock()
    res: dict[str, Any] = {"seed": seed, "specs": list(SPECS), "n_train": PER_SPEC_TRAIN * len(SPECS),
                           "settings": {k: p[k] for k in ("sft_steps", "batch_size", "lr", "lora_r", "lora_alpha",
                                                          "max_length", "n_test", "bfcl_limit", "max_new_tokens")}}
    with stage("data"):
        data = _data(out, seed)
    with stage("eval_base"):
        res["before"] = {**_evaluate(base, out / "eval-base", p, seed), "spec": _in_domain(base, out / "eval-base", seed)}
    with stage("sft"):
        if not (out / "sft" / "final").exists():
            run_sft(_sft_config(base, out, data, p, seed), resume=(out / "sft").exists())
    with stage("eval_sft"):
        final = str(out / "sft" / "final")
        res["after"] = {**_evaluate(final, out / "eval-sft", p, seed), "spec": _in_domain(final, out / "eval-sft", seed)}
    res["seconds"], res["peak_rss_mb_by_stage"] = stage.times, stage.peak
    atomic_write_text(out / "summary.json", json.dumps(res, indent=1))
    return res


def collect(dirs: list[Path]) -> None:
    runs = [json.loads((d / "summary.json").read_text()) for d in dirs]
    print(f"{'seed':<5} {'':<7} {'generated envs':>15} {'fncall held-out':>16} {'BFCL simple_python':>19}")
    for r in runs:
        for when in ("before", "after"):
            m = r[when]
            print(f"{r['seed']:<5} {when:<7} {m['spec']:>15.0%} {m['fncall']:>16.0%} {m['bfcl_simple_python']:>19.0%}")
    dest = Path(__file__).parent / "results" / "spec_env_transfer.json"
    dest.write_text(json.dumps({"runs": runs, "command": "OMP_NUM_THREADS=1 python benchmarks/spec_env_transfer.py "
                                "--seed S --out runs/spec-transfer-sS"}, indent=1))
    print(f"wrote {dest}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--collect", nargs="+", type=Path, help="summarise finished runs instead of running one")
    a = ap.parse_args()
    if a.collect:
        collect(a.collect)
        return
    if a.out is None:
        ap.error("--out is needed to run a seed")
    t0 = time.time()
    res = run(a.seed, a.out)
    print(json.dumps({k: res[k] for k in ("before", "after", "seconds")}, indent=1), f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
