"""The Environment protocol: the one interface rollouts, data generation and evaluation use.

An environment instance holds the state of one episode. ``reset`` starts it from a ``Task``;
``step`` takes the agent's assistant message (already parsed into tool calls) and answers with
observation messages, a reward and whether the episode is over. Success is decided on the
environment's state, never by matching free text alone. Environments never import torch.

This module is the protocol only: environments, adapters and plug-ins import it, and the registry
that finds an environment by name (``trajtune.envs.registry``) sits above it, so defining an
environment never imports the others.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from trajtune.errors import EnvError
from trajtune.schema import Message, ToolSpec, Trajectory


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
    # True when the state depends only on the task and the actions taken, so replaying an action
    # prefix after ``reset`` reaches the same state again (``reach``). Expert-failure mining and
    # step-level preference pairs start episodes from such states. False unless an environment
    # says so: replaying a world with outside state (a live server, unseeded randomness) would
    # silently land somewhere else.
    deterministic: bool = False
    # For `trajtune envs show`: how to install the optional package a plug-in needs ("" : none), and
    # the names of the terms a step reports in info["reward_terms"] (reward.terms weighs them as info.NAME).
    install: str = ""
    reward_terms: tuple[str, ...] = ()
    # Several roles acting in turn in one episode (envs/adapters/roles.py); () for one agent.
    roles: tuple[str, ...] = ()

    @abstractmethod
    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        """Generate ``n`` tasks of ``split`` ("train" or "test"); the splits never share a task seed."""

    @abstractmethod
    def reset(self, task: Task) -> ResetResult:
        """Start an episode on ``task``; return the initial messages and the tools on offer."""

    @abstractmethod
    def step(self, action: Message) -> StepResult:
        """Apply the assistant message (its ``tool_calls`` or final text) to the state."""

    def acting_role(self) -> str | None:
        """The role whose turn is next, in an environment with ``roles``; None with one agent."""
        return None

    def splits(self) -> dict[str, int] | None:
        """Task count per split, for an environment with a fixed task set (a benchmark's task file);
        None for one that generates tasks from seeds (as many as asked for)."""
        return None

    def success(self) -> bool:
        """Whether the current state satisfies the task (checked on state, not on text)."""
        return False

    def expert(self, task: Task) -> Trajectory:
        """A scripted expert's trajectory for ``task`` (for SFT data). Optional."""
        raise NotImplementedError(f"environment {self.name!r} has no scripted expert")

    def render(self) -> str:
        """A human-readable view of the current state."""
        return f"<{self.name}>"

    # Optional: snapshots. An environment that can copy its state implements both; then a state can
    # be returned to without replaying actions (MC-Critic on an environment that is not
    # deterministic). The snapshot is an opaque value the same class's ``restore`` accepts.
    def snapshot(self) -> Any:
        """A copy of the current state (optional; see ``can_snapshot``)."""
        raise NotImplementedError(f"environment {self.name!r} cannot take snapshots")

    def restore(self, state: Any) -> None:
        """Return to a state ``snapshot`` returned (on this or a fresh instance of the same class)."""
        raise NotImplementedError(f"environment {self.name!r} cannot restore snapshots")

    def can_snapshot(self) -> bool:
        return type(self).snapshot is not Environment.snapshot and type(self).restore is not Environment.restore

    def reach(self, task: Task, prefix: list[Message]) -> tuple[list[Message], list[ToolSpec], bool]:
        """Put the environment in the state after ``prefix`` (a conversation on ``task``) and return
        the history, the tools on offer and whether the episode already ended there.

        The default resets and replays the prefix's assistant actions; observations come from the
        environment, never from the prefix, so the history is what the policy would have seen. An
        environment that can restore a snapshot directly may override this; one that is not
        ``deterministic`` must not be replayed."""
        if not self.deterministic:
            raise EnvError(f"environment {self.name!r} is not deterministic, so a state cannot be reached by "
                           "replaying actions; set `deterministic = True` on the class if its state depends only "
                           "on the task and the actions, or override `reach` to restore a snapshot")
        res = self.reset(task)
        messages, tools = list(res.messages), list(res.tools)
        for m in prefix:
            if m.role != "assistant":
                continue
            messages.append(m)
            out = self.step(m)
            messages.extend(out.observations)
            if isinstance(out.info.get("tools"), list) and out.info["tools"]:
                tools = [t if isinstance(t, ToolSpec) else ToolSpec.model_validate(t) for t in out.info["tools"]]
            if out.done or (out.termination and out.termination != "done"):
                return messages, tools, True
        return messages, tools, False


OptionsT = TypeVar("OptionsT", bound=BaseModel)


def parse_env_options(model: type[OptionsT], env: str, options: dict[str, Any]) -> OptionsT:
    """Validate an environment's keyword options with its pydantic ``model``; a bad one is a one-line
    ``EnvError`` naming the field and the known options (the keywords are not in the signature)."""
    try:
        return model(**options)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or "options"
        raise EnvError(f"{env} option {field}: {err['msg']} (known options: {', '.join(model.model_fields)})") from None
