"""The Environment protocol: the one interface rollouts, data generation and evaluation use.

An environment instance holds the state of one episode. ``reset`` starts it from a ``Task``;
``step`` takes the agent's assistant message (already parsed into tool calls) and answers with
observation messages, a reward and whether the episode is over. Success is decided on the
environment's state, never by matching free text alone. Environments never import torch.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trajtune.errors import EnvError
from trajtune.schema import Message, ToolSpec, Trajectory


class UnknownEnvError(EnvError, KeyError):
    """No environment is registered under the name (a KeyError too, for callers that look names up)."""


@dataclass(frozen=True)
class Task:
    """One problem instance. ``seed`` determines it fully; ``split`` keeps train and test apart."""

    id: str
    seed: int
    split: str = "train"
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class ResetResult:
    messages: list[Message]
    tools: list[ToolSpec]


@dataclass
class StepResult:
    observations: list[Message]
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    # Set when the environment itself ends the episode for a reason other than "done"
    # (e.g. "env_error", "timeout").
    termination: str | None = None


class Environment(ABC):
    """Base class for environments. Subclasses set ``name`` and implement the abstract methods."""

    name: str = "base"
    description: str = ""
    max_turns: int = 8

    @abstractmethod
    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        """Generate ``n`` tasks of ``split`` ("train" or "test"); the splits never share a task seed."""

    @abstractmethod
    def reset(self, task: Task) -> ResetResult:
        """Start an episode on ``task``; return the initial messages and the tools on offer."""

    @abstractmethod
    def step(self, action: Message) -> StepResult:
        """Apply the assistant message (its ``tool_calls`` or final text) to the state."""

    def success(self) -> bool:
        """Whether the current state satisfies the task (checked on state, not on text)."""
        return False

    def expert(self, task: Task) -> Trajectory:
        """A scripted expert's trajectory for ``task`` (for SFT data). Optional."""
        raise NotImplementedError(f"environment {self.name!r} has no scripted expert")

    def render(self) -> str:
        """A human-readable view of the current state."""
        return f"<{self.name}>"


EnvFactory = Callable[..., Environment]
_REGISTRY: dict[str, EnvFactory] = {}


def register_env(name: str) -> Callable[[EnvFactory], EnvFactory]:
    def deco(factory: EnvFactory) -> EnvFactory:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"environment {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory

    return deco


def make_env(name: str, **kwargs: Any) -> Environment:
    from trajtune import envs as _envs  # noqa: F401  (registers the built-ins)

    if name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY)) or "(none)"
        raise UnknownEnvError(f"unknown environment {name!r}; known environments: {known}")
    factory = _REGISTRY[name]
    try:  # wrong arguments (e.g. a typo in --env-arg / env.kwargs) are the user's, not a bug
        inspect.signature(factory).bind(**kwargs)
    except TypeError as e:
        raise EnvError(f"environment {name!r}: {e}") from None
    except ValueError:  # no signature to check (a builtin): let the call decide
        pass
    return factory(**kwargs)


def list_envs() -> dict[str, EnvFactory]:
    from trajtune import envs as _envs  # noqa: F401

    return dict(sorted(_REGISTRY.items()))
