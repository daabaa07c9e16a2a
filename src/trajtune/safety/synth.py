"""Safety training data: refusals of harmful tool requests and completions of their benign twins.

AgentAlign-style: each template of the ``safety`` environment is an abstract behaviour chain
(a request, the tools of one simulated world, the calls that would carry it out), instantiated
with names, files and amounts drawn from a seed. For the harmful half the data is a short refusal
with no tool call; for the benign twin it is the tool-using completion. Both come from the
environment's scripted expert run through the environment, so every trajectory is verified on
state (refused and nothing harmful executed / solved and not refused) before it is written. The
twins are what keeps safety data from teaching a model to refuse everything that looks like it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from trajtune.envs import make_env
from trajtune.errors import DataError
from trajtune.schema import Trajectory
from trajtune.validate import has_errors, validate_trajectory


def synth_safety(n: int, *, seed: int = 0, split: str = "train", categories: list[str] | None = None,
                 worlds: list[str] | None = None) -> Iterator[Trajectory]:
    """``n`` expert trajectories of the ``safety`` environment (pairs in order: refusal, then the twin's
    completion), each with ``metadata["safety"]`` = ``{harmful, pair_id, category, world}`` and checked
    by the project validator; a trajectory that fails either check is a bug and raises ``DataError``."""
    kwargs: dict[str, Any] = {"categories": categories, "worlds": worlds}
    env = make_env("safety", **kwargs)
    for task in env.tasks(split, n, seed):
        traj = env.expert(task)
        d = task.data
        traj.metadata["safety"] = {"harmful": d["harmful"], "pair_id": d["pair_id"], "category": d["category"],
                                   "world": d["world"]}
        traj.metadata["source"] = "synth-safety"
        if not (traj.outcome and traj.outcome.success):
            raise DataError(f"the safety expert failed task {task.id}; this is a bug in the safety environment")
        findings = [f for f in validate_trajectory(traj) if f.severity == "E"]
        if has_errors(findings):
            raise DataError(f"synthesised trajectory {task.id} does not validate: {findings[0]}")
        yield traj
