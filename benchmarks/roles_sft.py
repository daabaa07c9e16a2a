"""SFT with an adapter per role against one shared adapter, on the roles showcase's team task.

The task, data and starting point are `roles_showcase.py`'s (run it first): `home`'s `copy` and
`toggle` kinds wrapped by the `roles` environment, a scout that may only look and an operator that
changes things; per seed, its 1,000 expert team episodes and its under-trained full-weight SFT
checkpoint (the newest below 60 % joint success on training tasks). From that checkpoint, LoRA SFT
on the same expert episodes, two arms with the same records per step:
- `shared`: one adapter learns both roles' turns (16 records per step);
- `per_role`: `role_adapters: true`, an adapter per role, each learning only its role's turns (a
  record trains as two rows, one per role, so 32 rows: the same 16 records and trained tokens).
Scored by joint success on the showcase's 100 held-out test tasks (greedy), with the failed episodes
classified by their first mistake (who made it, and what). Settings were fixed before the runs.

    python benchmarks/roles_showcase.py --seeds 0 1 --out runs/roles-showcase    # first
    python benchmarks/roles_sft.py --seeds 0 1 --start runs/roles-showcase --out runs/roles-sft

Prints a table and writes benchmarks/results/roles_sft.json. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from _tiny_runs import apply_sets
from roles_showcase import P as SHOWCASE, _env, _success, failures

S: dict[str, Any] = {"steps": 150, "lr": 1e-3, "lora_r": 16, "records_per_step": 16, "warmup_steps": 5}
ARMS = {"shared": False, "per_role": True}


def _sft(start: Path, data: Path, out: Path, seed: int, per_role: bool) -> Path:
    from trajtune.algorithms.sft import SFTRunConfig
    from trajtune.train import run_sft

    rows = S["records_per_step"] * (2 if per_role else 1)  # two roles: a record is two rows
    run_sft(SFTRunConfig.model_validate({
        "model": {"name_or_path": str(start), "lora": {"r": S["lora_r"], "alpha": 2 * S["lora_r"]}},
        "output_dir": str(out), "seed": seed, "role_adapters": per_role, "report": False,
        "data": {"path": str(data), "format": "ir", "max_length": SHOWCASE["max_length"]},
        "train": {"steps": S["steps"], "lr": S["lr"], "schedule": "constant", "warmup_steps": S["warmup_steps"],
                  "batch_size": rows, "micro_batch_size": rows},
    }))
    return out / "final"


def run_seed(seed: int, start_root: Path, out: Path) -> dict[str, Any]:
    showcase = json.loads((start_root / f"s{seed}" / "summary.json").read_text())
    start = start_root / f"s{seed}" / "sft" / "checkpoints" / showcase["weak_checkpoint"]
    data = start_root / f"s{seed}" / "data" / "train.jsonl"
    test = _env().tasks("test", SHOWCASE["n_test"], seed=seed)
    res: dict[str, Any] = {"seed": seed, "start": str(start), "showcase_before": showcase["before"],
                           "before": _success(start, test, seed, out, "weak"), "seconds": {}}
    for arm, per_role in ARMS.items():
        t0 = time.time()
        final = out / f"sft-{arm}" / "final"
        if not final.exists():
            _sft(start, data, out / f"sft-{arm}", seed, per_role)
        res["seconds"][arm] = round(time.time() - t0, 1)
        res[arm] = _success(final, test, seed, out, f"sft-{arm}")
    (out / "summary.json").write_text(json.dumps(res, indent=1))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--start", type=Path, default=Path("runs/roles-showcase"), help="roles_showcase.py's --out")
    ap.add_argument("--out", type=Path, default=Path("runs/roles-sft"))
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="change a setting (JSON values)")
    a = ap.parse_args()
    shown = apply_sets(ap, a.set, S)
    runs = [run_seed(s, a.start, a.out / f"s{s}") for s in a.seeds]
    print(f"{'seed':<5} {'before':>7} {'SFT, shared adapter':>20} {'SFT, adapter per role':>22}")
    for r in runs:
        print(f"{r['seed']:<5} {r['before']:>7.0%} {r['shared']:>20.0%} {r['per_role']:>22.0%}")
    table = failures(a.out, a.seeds, ["weak", *(f"sft-{arm}" for arm in ARMS)])
    dest = Path(__file__).parent / "results" / "roles_sft.json"
    dest.write_text(json.dumps({"settings": S, "runs": runs, "first_mistakes": table,
                                "command": f"python benchmarks/roles_sft.py --seeds {' '.join(map(str, a.seeds))} "
                                           f"--start {a.start} --out {a.out} {shown}".strip()}, indent=1))
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
