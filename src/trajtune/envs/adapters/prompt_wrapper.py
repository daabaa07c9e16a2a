"""An environment that changes only the first prompt of another one (the FAFT feedback slot, a
tfgrpo lesson library): one place that forwards everything else, snapshots included, so a wrapped
environment keeps every ability of the one it wraps."""

from __future__ import annotations

from typing import Any

from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.schema import Message


class PromptWrapper(Environment):
    """Subclasses implement ``rewrite`` (the reset messages → the messages the agent sees)."""

    def __init__(self, inner: Environment, description: str | None = None):
        self.inner = inner
        self.name = inner.name
        self.description = inner.description if description is None else description
        self.max_turns = getattr(inner, "max_turns", 8)
        self.deterministic = inner.deterministic

    def rewrite(self, messages: list[Message]) -> list[Message]:
        raise NotImplementedError

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return self.inner.tasks(split, n, seed)

    def reset(self, task: Task) -> ResetResult:
        res = self.inner.reset(task)
        return ResetResult(messages=self.rewrite(list(res.messages)), tools=res.tools)

    def step(self, action: Message) -> StepResult:
        return self.inner.step(action)

    def success(self) -> bool:
        return self.inner.success()

    def render(self) -> str:
        return self.inner.render()

    def snapshot(self) -> Any:
        return self.inner.snapshot()

    def restore(self, state: Any) -> None:
        self.inner.restore(state)

    def can_snapshot(self) -> bool:
        return self.inner.can_snapshot()

    def __getattr__(self, name: str) -> Any:  # environment-specific attributes (e.g. a benchmark's failure)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
