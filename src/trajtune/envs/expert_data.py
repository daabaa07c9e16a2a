"""Expert trajectories written to a JSONL file: what ``trajtune data generate`` and a recipe's
``generate`` stage both do, kept in one place so the two never disagree on what is written."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajtune.envs.base import Task
from trajtune.errors import EnvError, ModelLoadError
from trajtune.schema import AtomicJsonlWriter, Trajectory


@dataclass
class ExpertDataStats:
    kept: int = 0
    successes: int = 0
    tasks: int = 0
    terminations: dict[str, int] = field(default_factory=dict)

    def line(self, out: Path, who: str) -> str:
        terms = ", ".join(f"{k}={v}" for k, v in sorted(self.terminations.items()))
        return f"wrote {self.kept} trajectories to {out} ({self.successes}/{self.tasks} {who} successes; {terms})"


def write_expert_data(env: str, kwargs: dict[str, Any], tasks: list[Task], out: Path, *, overwrite: bool = False,
                      only_success: bool = False, teacher: Callable[..., Any] | None = None,
                      teacher_name: str = "") -> ExpertDataStats:
    """One trajectory per task, by the environment's scripted expert or by ``teacher`` (a policy for
    ``envs.runner.run_episodes``), written atomically to ``out``."""
    from trajtune.envs.registry import make_env

    made: list[Trajectory] = []
    if teacher is not None:
        from trajtune.envs.runner import run_episodes

        made = run_episodes(lambda: make_env(env, **kwargs), tasks, teacher)
        errors = [t for t in made if t.outcome is not None and t.outcome.termination == "policy_error"]
        if errors and len(errors) == len(made):
            raise ModelLoadError(f"--policy {teacher_name}: every episode failed: {errors[0].metadata.get('error')}")
    stats = ExpertDataStats(tasks=len(tasks))
    with AtomicJsonlWriter(out, overwrite=overwrite) as writer:
        for i, task in enumerate(tasks):
            try:
                traj = made[i] if teacher is not None else make_env(env, **kwargs).expert(task)
            except NotImplementedError as e:
                raise EnvError(f"environment {env!r} has no scripted expert: {e}") from None
            ok = bool(traj.outcome and traj.outcome.success)
            stats.successes += ok
            term = (traj.outcome.termination if traj.outcome else None) or "unknown"
            stats.terminations[term] = stats.terminations.get(term, 0) + 1
            if only_success and not ok:
                continue
            writer.write(traj)
            stats.kept += 1
    return stats
