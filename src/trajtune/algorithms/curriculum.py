"""A curriculum over task difficulty (``rl.curriculum``).

Why: a policy that solves none of the hard tasks gets no signal from them (every group has equal
rewards). Training on the easy ones first, and adding harder ones once the easy ones are mostly
solved, keeps groups informative. Tasks carry a number in ``task.data["difficulty"]`` (built-in
``home``: 0 set, 1 copy, 2 toggle; an environment of your own sets it in ``tasks()``).

The pool starts with the lowest level. After each step the success rate of that step's episodes
on tasks *at the current level* is added up; once at least ``min_episodes`` of them have been seen
and their success rate reaches ``promote_at``, the next level joins the pool (earlier levels stay)
and the count restarts. Tasks are taken from the pool in a fixed order cycled by step, as without a
curriculum, so a run is a function of its seed and the level history; the level and the counts are
saved in checkpoints (``source_state.pt``), so resume is exact.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from trajtune.config import _C
from trajtune.errors import ConfigError
from trajtune.experience import pick_tasks


class CurriculumSpec(_C):
    promote_at: float = Field(0.8, gt=0, le=1, description="success rate on the current level that adds the next "
                                                           "level to the pool")
    min_episodes: int = Field(16, gt=0, description="episodes at the current level to see before a promotion")


class Curriculum:
    def __init__(self, spec: CurriculumSpec, tasks: list[Any], env_name: str = "the environment"):
        missing = [t.id for t in tasks if not isinstance(t.data.get("difficulty"), (int, float))]
        if missing:
            raise ConfigError(f"rl.curriculum: {len(missing)} training task(s) of {env_name} have no numeric "
                              f"data['difficulty'] (e.g. {missing[0]!r}); set it in the environment's tasks()")
        self.spec, self.tasks = spec, tasks
        self.levels = sorted({float(t.data["difficulty"]) for t in tasks})
        if len(self.levels) < 2:
            raise ConfigError(f"rl.curriculum: every training task of {env_name} has difficulty {self.levels[0]:g}; "
                              "a curriculum needs at least two levels")
        self.level, self.seen, self.solved = 0, 0, 0

    def pool(self) -> list[Any]:
        top = self.levels[self.level]
        return [t for t in self.tasks if float(t.data["difficulty"]) <= top]

    def pick(self, step: int, round_no: int, k: int, seed: int) -> list[Any]:
        """The tasks of a step, picked from the pool as ``RolloutSource`` picks from all tasks."""
        return pick_tasks(self.pool(), step, round_no, k, seed)

    def observe(self, episodes: list[Any]) -> dict[str, float]:
        """Count this step's episodes at the current level; promote when they are solved often enough."""
        top = self.levels[self.level]
        here = [e for e in episodes if e.task is not None and float(e.task.data["difficulty"]) == top]
        self.seen += len(here)
        self.solved += sum(1 for e in here if e.trajectory.outcome and e.trajectory.outcome.success)
        rate = self.solved / self.seen if self.seen else 0.0
        promoted = 0.0
        if self.level + 1 < len(self.levels) and self.seen >= self.spec.min_episodes and rate >= self.spec.promote_at:
            self.level, self.seen, self.solved, promoted = self.level + 1, 0, 0, 1.0
        return {"curriculum_level": float(self.levels[self.level]), "curriculum_success": rate,
                "curriculum_promoted": promoted}

    def state_dict(self) -> dict[str, int]:
        return {"level": self.level, "seen": self.seen, "solved": self.solved}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.level, self.seen, self.solved = int(state["level"]), int(state["seen"]), int(state["solved"])
