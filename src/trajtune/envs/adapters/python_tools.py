"""A plain Python class as an environment: its public methods are the tools.

Users who already have Python functions for their domain should not have to learn a protocol::

    class Bank:
        def __init__(self, task):            # or no arguments
            self.balance = task.data["start"]
        def deposit(self, amount: int) -> str:
            \"\"\"Deposit money.

            Args:
                amount: how much, in cents
            \"\"\"
            self.balance += amount
            return f"balance {self.balance}"

    env = PythonToolsEnv(Bank, tasks=[Task("t1", 1, data={"prompt": "Deposit 5", "start": 0})],
                         reward_fn=lambda bank, task: float(bank.balance == 5))

Tool specs come from type hints and Google-style docstrings (``Args:`` section). A fresh
toolbox is made for every episode, so episodes never share state. The reward function is
called on the toolbox (the state) when the episode ends; success defaults to ``reward > 0``.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Sequence
from typing import Any

from trajtune.envs.base import Task
from trajtune.envs.toolenv import ToolEnv
from trajtune.envs.tools import ToolDispatcher, ToolError, function_to_toolspec, public_methods
from trajtune.schema import Message, ToolSpec


def _make_toolbox(factory: Callable[..., Any], task: Task) -> Any:
    """Call ``factory(task)`` if it takes an argument, else ``factory()``."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return factory()
    positional = [p for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"]
    return factory(task) if positional else factory()


class PythonToolsEnv(ToolEnv):
    """Environment whose tools are the public methods of a user class (see module docstring)."""

    def __init__(self, toolbox: Callable[..., Any], *, tasks: Sequence[Task] | Callable[[str, int, int], list[Task]] = (),
                 reward_fn: Callable[[Any, Task], float] | None = None,
                 success_fn: Callable[[Any, Task], bool] | None = None,
                 turn_reward_fn: Callable[[Any, Task, Message, list[Message]], float] | None = None,
                 prompt: str | Callable[[Task], str] | None = None,
                 system_prompt: str | None = None, max_turns: int = 8, name: str = "python_tools",
                 recoverable: tuple[type[BaseException], ...] = (ToolError,), deterministic: bool = False):
        super().__init__()
        # a fresh toolbox per episode, but its methods are the user's: replayable only when they say so
        self.deterministic = deterministic
        self.toolbox_factory = toolbox
        self._tasks = tasks
        self.reward_fn = reward_fn
        self.success_fn = success_fn
        self.turn_reward_fn = turn_reward_fn
        self._prompt = prompt
        if system_prompt is not None:
            self.system_prompt = system_prompt
        self.max_turns = max_turns
        self.name = name
        self.recoverable = recoverable
        self.toolbox: Any = None
        self.description = (inspect.getdoc(toolbox) or "").split("\n\n")[0]

    def static_tools(self) -> list[ToolSpec]:
        """Tool specs without making a toolbox (for listings): from the class's public methods."""
        klass = self.toolbox_factory if inspect.isclass(self.toolbox_factory) else type(self.toolbox)
        specs = []
        for k in reversed(klass.__mro__):
            if k is object:
                continue
            for n, attr in vars(k).items():
                if not n.startswith("_") and (inspect.isfunction(attr) or isinstance(attr, staticmethod)):
                    specs.append(function_to_toolspec(getattr(klass, n), n))
        return specs

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        if callable(self._tasks):
            return list(self._tasks(split, n, seed))
        pool = [t for t in self._tasks if t.split == split]
        random.Random(seed).shuffle(pool)
        return pool[:n]

    def setup(self, task: Task) -> None:
        self.toolbox = _make_toolbox(self.toolbox_factory, task)
        self._dispatcher = ToolDispatcher(public_methods(self.toolbox), recoverable=self.recoverable)

    def prompt(self, task: Task) -> str:
        if callable(self._prompt):
            return self._prompt(task)
        if isinstance(self._prompt, str):
            return self._prompt
        if "prompt" not in task.data:
            raise KeyError(f"task {task.id!r} has no data['prompt'] and the environment was given no prompt")
        return str(task.data["prompt"])

    def turn_reward(self, action: Message, observations: list[Message]) -> float:
        if self.turn_reward_fn is None or self.task is None:
            return 0.0
        return float(self.turn_reward_fn(self.toolbox, self.task, action, observations))

    def final_reward(self) -> float:
        if self.reward_fn is None or self.task is None:
            return 0.0
        return float(self.reward_fn(self.toolbox, self.task))

    def success(self) -> bool:
        if self.task is None or self.toolbox is None:
            return False
        if self.success_fn is not None:
            return bool(self.success_fn(self.toolbox, self.task))
        return self.reward_fn is not None and self.final_reward() > 0

    def state_view(self) -> str:
        if self.toolbox is None:
            return ""
        state = {k: v for k, v in vars(self.toolbox).items() if not k.startswith("_")}
        return "state: " + repr(state)[:500]
