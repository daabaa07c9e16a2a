"""What a τ²-bench pass^1 means: the scripted expert (an upper bound: it replays the gold actions) and
an agent that refuses everything (a floor: it passes every task whose right answer is to change
nothing), per domain and split, with the scripted user. No model; about a minute on one core.

    python benchmarks/tau2_baselines.py        # prints the table, writes benchmarks/results/tau2_baselines.json

A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from trajtune.envs import make_env
from trajtune.envs.runner import run_episode
from trajtune.schema import Message


def refuse(messages: list[Message], tools: list) -> Message:
    return Message(role="assistant", content="I am sorry, but I cannot help with that.")


def main() -> None:
    rows = []
    for domain in ("airline", "retail"):
        env = make_env("tau2", domain=domain)
        for split in ("train", "test"):
            tasks = env.tasks(split, 1000)
            expert = sum(bool(env.expert(t).outcome.success) for t in tasks)
            floor = sum(bool(run_episode(env, t, refuse).outcome.success) for t in tasks)
            rows.append({"domain": domain, "split": split, "tasks": len(tasks), "expert": expert / len(tasks),
                         "refuse_everything": floor / len(tasks)})
    print("| domain | split | tasks | scripted expert | refuse everything |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['domain']} | {r['split']} | {r['tasks']} | {r['expert']:.0%} | {r['refuse_everything']:.0%} |")
    dest = Path(__file__).parent / "results" / "tau2_baselines.json"
    dest.write_text(json.dumps({"user": "scripted", "rows": rows}, indent=1) + "\n")
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
