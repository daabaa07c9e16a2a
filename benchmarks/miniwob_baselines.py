"""Baselines on MiniWoB++ tasks: the scripted expert where one exists (an upper bound), a policy that
clicks a uniformly drawn element of the page each turn (a floor), and models evaluated greedily as
`trajtune eval` runs them, on held-out (test-split) pages.

    OMP_NUM_THREADS=1 python benchmarks/miniwob_baselines.py --tasks 30 --models smollm2-135m

Writes benchmarks/results/miniwob_baselines.json. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from pathlib import Path

from trajtune.envs import make_env
from trajtune.envs.runner import run_episode
from trajtune.schema import Message, ToolCall, Trajectory


def random_clicker(seed: int):
    rng = random.Random(f"clicker-{seed}")

    def policy(messages: list[Message], tools: list) -> Message:
        refs = [int(r) for r in re.findall(r"^\[(\d+)\]", messages[-1].text(), re.M)]
        return Message(role="assistant", tool_calls=[ToolCall(id="c", name="click", arguments={"ref": rng.choice(refs)})])

    return policy


def _stats(trajs: list[Trajectory]) -> dict:
    n = len(trajs)
    terms: dict[str, int] = {}
    for t in trajs:
        key = t.outcome.termination if t.outcome else "unknown"
        terms[key] = terms.get(key, 0) + 1
    calls = [len(m.tool_calls or []) for t in trajs for m in t.messages if m.role == "assistant"]
    return {"success": sum(bool(t.outcome and t.outcome.success) for t in trajs) / n,
            "turns_with_a_call": sum(c > 0 for c in calls) / max(1, len(calls)), "terminations": terms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks-of", nargs="+", default=["click-test-2", "click-button", "enter-text"])
    ap.add_argument("--tasks", type=int, default=30)
    ap.add_argument("--models", nargs="*", default=[])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "miniwob_baselines.json"))
    args = ap.parse_args()

    rows = []
    for name in args.tasks_of:
        env = make_env("miniwob", task=name)
        tasks = env.tasks("test", args.tasks)
        try:
            rows.append({"task": name, "agent": "scripted expert", **_stats([env.expert(t) for t in tasks])})
        except NotImplementedError:
            pass
        rows.append({"task": name, "agent": "random click", **_stats(
            [run_episode(env, t, random_clicker(t.seed)) for t in tasks])})
        for model in args.models:
            from trajtune.eval.harness import EvalSettings
            from trajtune.eval.run import run_eval

            slug = re.sub(r"[^\w.-]+", "_", model)
            out = Path("runs") / "miniwob-baselines" / f"{slug}-{name}"
            t0 = time.time()
            run_eval(EvalSettings(model=model, env="miniwob", env_kwargs={"task": name}, tasks=args.tasks,
                                  max_new_tokens=args.max_new_tokens, batch_size=8), out_dir=out, overwrite=True,
                     quiet=True)
            trajs = [Trajectory.model_validate_json(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
            rows.append({"task": name, "agent": f"{model} (greedy)", **_stats(trajs),
                         "seconds": round(time.time() - t0, 1), "episodes": str(out / "episodes.jsonl")})
    print(f"{args.tasks} test pages per task\n| task | agent | success | turns with a tool call | terminations |\n"
          "|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['task']} | {r['agent']} | {r['success']:.0%} | {r['turns_with_a_call']:.0%} | {r['terminations']} |")
    Path(args.out).write_text(json.dumps({"tasks": args.tasks, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
