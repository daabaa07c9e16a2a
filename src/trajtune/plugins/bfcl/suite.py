"""BFCL as ``trajtune eval --benchmark bfcl``: the eval-suite plug-in ``bfcl`` (``trajtune.plugins``).

Per category: single-turn ones as one prompt→completion each, scored by ``score_single_turn``
(BFCL's AST / relevance rules); multi-turn ones as ``BFCLMultiTurnEnv`` episodes, whose verdict
``finish`` records. ``--limit`` takes the first N entries of each category; the results get a
``bfcl`` section (``bfcl_report``: per-category accuracy, groups, failure reasons).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trajtune.envs.base import Environment, Task
from trajtune.eval.metrics import agent_messages, episode_stats
from trajtune.eval.suites import EvalSuite, Suite, SuiteSettings
from trajtune.plugins.bfcl.data import MULTI_TURN_CATEGORIES, load_bfcl, resolve_categories
from trajtune.plugins.bfcl.multi_turn import BFCLMultiTurnEnv
from trajtune.plugins.bfcl.runner import bfcl_report, default_parse_fn, score_single_turn
from trajtune.schema import Outcome, Trajectory


def finish(env: Environment, traj: Trajectory) -> None:
    """Record BFCL's verdict for a multi-turn episode (reason as in ``run_bfcl``)."""
    failure = getattr(env, "failure", None) or {}
    ok = bool(traj.outcome and traj.outcome.success)
    term = traj.outcome.termination if traj.outcome else None
    reason = "ok" if ok else str(failure.get("error_type") or f"multi_turn:{term or 'failed'}")
    ref = getattr(env, "traj", None)
    traj.metadata["bfcl_category"] = ref.reference.data["category"] if ref is not None else None
    traj.metadata["bfcl_reason"] = reason
    if failure:
        traj.metadata["bfcl_failure"] = failure


def score(ref: Trajectory, text: str | None, parser: str) -> Trajectory:
    """The scored episode of one single-turn entry (``text`` None: the prompt alone filled the context)."""
    r = score_single_turn(ref, text or "", default_parse_fn(parser))
    traj = r.trajectory
    assert traj is not None
    valid = r.valid
    if text is None:  # no answer at all
        valid = False
        traj.outcome = Outcome(success=False, termination="context_overflow")
        traj.reward = 0.0
        traj.metadata["bfcl_reason"] = "context_overflow"
    traj.metadata["bfcl_category"] = r.category
    traj.metadata["eval"] = {"tool_calls": {"valid": int(valid), "total": 1, "unit": "bfcl_item"}, "vote_on": "calls"}
    return traj


class BFCLSuite(EvalSuite):
    """The BFCL categories ``--categories`` names (default: all supported), one suite each."""

    name = "bfcl"
    takes_categories = True

    def suites(self, settings: SuiteSettings) -> list[Suite]:
        s = settings
        suites = []
        for cat in resolve_categories(s.categories or None):
            if cat in MULTI_TURN_CATEGORIES:
                def factory(cat: str = cat) -> Environment:
                    return BFCLMultiTurnEnv([cat], limit=s.limit)

                probe = factory()
                suites.append(Suite(name=f"bfcl:{cat}", tasks=probe.all_tasks(), category=cat, env_factory=factory,
                                    max_turns=s.max_turns or probe.max_turns, finish=finish))
            else:
                trajs = load_bfcl(cat, limit=s.limit)
                tasks = [Task(id=t.id, seed=i, split="test", data={"category": cat}) for i, t in enumerate(trajs)]
                suites.append(Suite(name=f"bfcl:{cat}", tasks=tasks, category=cat, prompts={t.id: t for t in trajs},
                                    score=score))
        return suites

    def report(self, episodes: Sequence[Trajectory]) -> dict[str, Any]:
        rows = []
        for t in episodes:
            st = episode_stats(t)
            rows.append({"id": t.id, "category": st["category"], "valid": st["success"],
                         "reason": str(t.metadata.get("bfcl_reason", "ok" if st["success"] else "failed")),
                         "format_errors": st["format_errors"],
                         "n_calls": sum(len(m.tool_calls or []) for m in agent_messages(t))})
        return bfcl_report(rows)
