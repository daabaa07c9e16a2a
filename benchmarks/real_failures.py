"""What the real-model demo still gets wrong, stage by stage: failure classes of BFCL and fncall.

Reads one or more finished ``trajtune demo --model ...`` run directories and counts, for each
evaluated stage (base, after SFT, after RL), why each failed episode failed:

- BFCL ``simple_python``: the AST checker's reason (``value_error:string``, ``missing_optional``,
  ``type_error``, ...); ``wrong_count`` is split into ``not parsed`` (the model wrote a call the
  Hermes parser could not read, e.g. a number with its unit) and ``no call`` (prose or code);
- ``fncall``: the environment's verdict (``wrong_value``, ``missing_param``, ...), recomputed from the
  stored episode against its task (rebuilt from the same seed), with the same split.

    python benchmarks/real_failures.py runs/real-s0 runs/real-s1

Prints one table per set and writes ``benchmarks/results/real_failures.json``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

STAGES = [("eval-base", "before"), ("eval-sft", "after SFT"), ("eval-rl", "after RL")]


def _episodes(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _unparsed(ep: dict[str, Any]) -> bool:
    return int(ep["metadata"].get("format_errors", 0)) > 0


def bfcl_reason(ep: dict[str, Any]) -> str | None:
    if ep["outcome"]["success"]:
        return None
    reason = ep["metadata"].get("bfcl_reason", "?")
    if reason == "wrong_count":
        return "not parsed" if _unparsed(ep) else "no call / several calls"
    return str(reason)


def fncall_reasons(run: Path, stage: str, settings: dict[str, Any], seed: int) -> Counter:
    from trajtune.demo_real import _env_kwargs
    from trajtune.envs import make_env
    from trajtune.envs.fncall import check_action
    from trajtune.schema import Message

    env = make_env("fncall", **_env_kwargs(settings))
    tasks = {t.id: t for t in env.tasks("test", settings["n_test"], seed=seed)}
    out: Counter = Counter()
    for ep in _episodes(run / stage / "fncall" / "episodes.jsonl"):
        if ep["outcome"]["success"]:
            continue
        task = tasks[ep["metadata"]["eval"]["task_id"]]
        reply = next(m for m in ep["messages"] if m["role"] == "assistant")
        kind = check_action(Message.model_validate(reply), task.data["target"],
                            next(t["parameters"] for t in task.data["tools"]
                                 if t["name"] == task.data["target"]["name"])).kind
        if kind == "no_call":
            kind = "not parsed" if _unparsed(ep) else "no call"
        out[kind] += 1
    return out


def analyse(run: Path) -> dict[str, Any]:
    s = json.loads((run / "summary.json").read_text())
    settings, seed = s["settings"], s["seed"]
    res: dict[str, Any] = {"run": str(run), "seed": seed, "bfcl": {}, "fncall": {}}
    for stage, label in STAGES:
        if not (run / stage).exists():
            continue
        bfcl = _episodes(run / stage / "bfcl" / "episodes.jsonl")
        res["bfcl"][label] = dict(Counter(r for r in map(bfcl_reason, bfcl) if r is not None))
        res["fncall"][label] = dict(fncall_reasons(run, stage, settings, seed))
    return res


def _table(kind: str, runs: list[dict[str, Any]]) -> str:
    labels = [label for _, label in STAGES if any(label in r[kind] for r in runs)]
    classes = sorted({c for r in runs for st in r[kind].values() for c in st},
                     key=lambda c: -sum(st.get(c, 0) for r in runs for st in r[kind].values()))
    head = f"| {kind} failure class | " + " | ".join(f"{lab} (seeds {'/'.join(str(r['seed']) for r in runs)})"
                                                    for lab in labels) + " |"
    lines = [head, "|" + "---|" * (len(labels) + 1)]
    for c in classes:
        cells = [" / ".join(str(r[kind].get(lab, {}).get(c, 0)) for r in runs) for lab in labels]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    totals = [" / ".join(str(sum(r[kind].get(lab, {}).values())) for r in runs) for lab in labels]
    lines.append("| **all failures** | " + " | ".join(totals) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="finished real-model demo directories")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "real_failures.json")
    a = ap.parse_args()
    runs = [analyse(r) for r in a.runs]
    print(_table("bfcl", runs))
    print()
    print(_table("fncall", runs))
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(runs, indent=1))
    print(f"\nwritten {a.json}")


if __name__ == "__main__":
    main()
