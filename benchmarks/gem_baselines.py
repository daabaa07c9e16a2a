"""Baselines on a GEM game: the scripted expert (binary search, an upper bound), a policy that guesses
uniformly in the stated range (a floor), and models evaluated greedily as `trajtune eval` runs them,
on the held-out (test-split) tasks.

    python benchmarks/gem_baselines.py --tasks 50                         # expert and random only
    OMP_NUM_THREADS=1 python benchmarks/gem_baselines.py --tasks 50 --models smollm2-135m runs/demo/base-model

Writes benchmarks/results/gem_baselines.json. A benchmark, not a test: it asserts nothing.
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
from trajtune.schema import Message


def random_guesser(seed: int):
    # not Random(seed): GEM draws the hidden number with random.seed(seed), so that guesser would
    # draw the same number and win every game on its first guess
    rng = random.Random(f"guesser-{seed}")

    def policy(messages: list[Message], tools: list) -> Message:
        lo, hi = map(int, re.search(r"between (\d+) and (\d+)", messages[1].text()).groups())
        return Message(role="assistant", content=f"\\boxed{{{rng.randint(lo, hi)}}}")

    return policy


def _episode_stats(trajs: list) -> dict:
    n = len(trajs)
    terms: dict[str, int] = {}
    for t in trajs:
        key = t.outcome.termination if t.outcome else "unknown"
        terms[key] = terms.get(key, 0) + 1
    return {"success": sum(bool(t.outcome and t.outcome.success) for t in trajs) / n,
            "mean_reward": sum(float(t.reward or 0.0) for t in trajs) / n,
            "invalid_answer": sum(float(t.reward or 0.0) < 0 for t in trajs) / n,  # GEM's -0.1: no \boxed{} answer
            "terminations": terms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env-id", default="game:GuessTheNumber-v0-easy")
    ap.add_argument("--tasks", type=int, default=50)
    ap.add_argument("--models", nargs="*", default=[])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "gem_baselines.json"))
    args = ap.parse_args()

    env = make_env("gem", env_id=args.env_id)
    tasks = env.tasks("test", args.tasks)
    rows = [{"agent": "scripted expert (binary search)", **_episode_stats([env.expert(t) for t in tasks])},
            {"agent": "uniform random guess", **_episode_stats(
                [run_episode(env, t, random_guesser(t.seed)) for t in tasks])}]
    for model in args.models:
        from trajtune.eval.harness import EvalSettings
        from trajtune.eval.run import run_eval
        from trajtune.schema import Trajectory

        out = Path("runs") / "gem-baselines" / re.sub(r"[^\w.-]+", "_", model)
        t0 = time.time()
        run_eval(EvalSettings(model=model, env="gem", env_kwargs={"env_id": args.env_id}, tasks=args.tasks,
                              max_new_tokens=args.max_new_tokens, batch_size=16), out_dir=out, overwrite=True,
                 quiet=True)
        trajs = [Trajectory.model_validate_json(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
        rows.append({"agent": f"{model} (greedy)", **_episode_stats(trajs), "seconds": round(time.time() - t0, 1),
                     "episodes": str(out / "episodes.jsonl")})
    print(f"{args.env_id}, {args.tasks} test tasks\n| agent | success | mean reward | invalid answer | terminations |\n"
          "|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['agent']} | {r['success']:.0%} | {r['mean_reward']:.3f} | {r['invalid_answer']:.0%} | "
              f"{r['terminations']} |")
    Path(args.out).write_text(json.dumps({"env_id": args.env_id, "tasks": args.tasks, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
