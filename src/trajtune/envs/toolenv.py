"""A base class for tool-calling worlds: state lives in Python, tools are its methods.

Subclasses implement ``setup(task)`` (build the state), ``prompt(task)`` (the user's request),
list their tool methods in ``tool_names``, and check ``success()`` on the state. The episode
ends when the agent answers in plain text (no tool calls) unless ``on_text`` decides otherwise
(e.g. to let a simulated user answer a clarifying question), or when a tool sets ``self.done``.

Reward: 0 on every turn except the last, which gets ``final_reward()`` (1.0 on success by
default); subclasses may add shaped per-turn rewards by overriding ``turn_reward``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Generator
from typing import Any

from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.envs.runner import run_episode
from trajtune.envs.tools import ToolDispatcher, ToolError
from trajtune.schema import Message, ToolCall, ToolSpec


def assistant_call(tool: str, /, **arguments: Any) -> Message:
    """An assistant message with one tool call (ids are filled in by the runner)."""
    return Message(role="assistant", content=None,
                   tool_calls=[ToolCall(id="", name=tool, arguments=arguments)])


def assistant_text(text: str) -> Message:
    return Message(role="assistant", content=text)


class ToolEnv(Environment):
    """Shared mechanics of the built-in tool-calling environments."""

    tool_names: tuple[str, ...] = ()
    deterministic = True  # built-in worlds draw everything from the task seed and the actions
    recoverable: tuple[type[BaseException], ...] = (ToolError,)
    system_prompt: str = "You are a helpful agent. Use the tools to complete the task, then reply with a short final answer."

    def __init__(self) -> None:
        self.task: Task | None = None
        self.done = False
        self.turn = 0
        self.transcript: list[str] = []
        self._dispatcher: ToolDispatcher | None = None

    # -- to implement -------------------------------------------------------------------------
    def setup(self, task: Task) -> None:
        """Build the episode's state from ``task``."""

    def prompt(self, task: Task) -> str:
        raise NotImplementedError

    def tool_functions(self) -> dict[str, Callable[..., Any]]:
        return {n: getattr(self, n) for n in self.tool_names}

    def tool_specs(self) -> dict[str, ToolSpec] | None:
        """The tools' schemas, for tools whose schema is data rather than a Python signature (an
        environment generated from specs); None: read from ``tool_functions``' signatures."""
        return None

    def on_text(self, text: str) -> tuple[list[Message], bool]:
        """A turn without tool calls: by default it is the final answer and ends the episode."""
        self.final_answer = text
        return [], True

    def turn_reward(self, action: Message, observations: list[Message]) -> float:
        return 0.0

    def final_reward(self) -> float:
        return 1.0 if self.success() else 0.0

    def expert_policy(self, task: Task) -> Callable[[list[Message], list[ToolSpec]], Message]:
        raise NotImplementedError(f"environment {self.name!r} has no scripted expert")

    # -- protocol -----------------------------------------------------------------------------
    @property
    def dispatcher(self) -> ToolDispatcher:
        if self._dispatcher is None:
            self._dispatcher = ToolDispatcher(self.tool_functions(), specs=self.tool_specs(),
                                              recoverable=self.recoverable)
        return self._dispatcher

    def reset(self, task: Task) -> ResetResult:
        self.task = task
        self.done = False
        self.turn = 0
        self.final_answer: str | None = None
        self.transcript = []
        self.setup(task)
        msgs = [Message(role="system", content=self.system_prompt, origin="system"),
                Message(role="user", content=self.prompt(task), origin="user")]
        return ResetResult(messages=msgs, tools=self.dispatcher.tools)

    def step(self, action: Message) -> StepResult:
        if self.task is None:
            raise RuntimeError("step() before reset()")
        self.turn += 1
        if action.tool_calls:
            obs = self.dispatcher.answer(action)
            for c, o in zip(action.tool_calls, obs):
                args = json.dumps(c.arguments or {}, sort_keys=True)
                self.transcript.append(f"call {c.name}({args}) -> {o.text()[:200]}")
            done = self.done
        else:
            self.transcript.append(f"say {action.text()[:200]!r}")
            obs, done = self.on_text(action.text())
            self.done = self.done or done
            done = self.done
        reward = self.turn_reward(action, obs)
        if done:
            reward += self.final_reward()
        return StepResult(observations=obs, reward=reward, done=done,
                          info={"success": self.success()} if done else {})

    def expert(self, task: Task):  # type: ignore[override]
        """Run the scripted expert through this environment (resets it) and return its trajectory."""
        traj = run_episode(self, task, self.expert_policy(task))
        traj.metadata["expert"] = True
        traj.metadata["policy"] = f"expert:{self.name}"
        return traj

    def state_view(self) -> str:
        """Subclasses describe their state here for ``render``."""
        return ""

    def snapshot(self) -> Any:
        """The whole episode state (everything but the tool dispatcher, which is rebuilt)."""
        import copy

        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k != "_dispatcher"})

    def restore(self, state: Any) -> None:
        import copy

        self.__dict__.update(copy.deepcopy(state))
        self._dispatcher = None

    def render(self) -> str:
        tid = self.task.id if self.task else "-"
        lines = [f"[{self.name}] task={tid} turn={self.turn} done={self.done} success={self.success() if self.task else None}"]
        view = self.state_view()
        if view:
            lines.append(view)
        lines.extend(f"  {t}" for t in self.transcript[-10:])
        return "\n".join(lines)


def latest_observation(messages: list[Message]) -> str:
    """Everything the environment said since the last assistant message, joined."""
    out: list[str] = []
    for m in reversed(messages):
        if m.role == "assistant":
            break
        out.append(m.text())
    return "\n".join(reversed(out))


def scripted_policy(script: Generator[Message, str, None]) -> Callable[[list[Message], list[ToolSpec]], Message]:
    """Turn a generator into a policy: it yields actions and is sent each new observation text.

    Scripted experts read the same observations an agent sees, so their trajectories are
    learnable (no hidden information leaks into the actions).
    """
    started = [False]

    def policy(messages: list[Message], tools: list[ToolSpec]) -> Message:
        if not started[0]:
            started[0] = True
            return next(script)
        try:
            return script.send(latest_observation(messages))
        except StopIteration:
            raise RuntimeError("the scripted expert ran out of actions before the episode ended") from None

    return policy


def split_task_seed(split: str, index: int, seed: int) -> int:
    """Task seeds for a split: train seeds are even, test seeds odd, so the splits never share one."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if index < 0 or seed < 0:
        raise ValueError("index and seed must be non-negative")
    return 2 * (seed * 1_000_003 + index) + (0 if split == "train" else 1)


def game_tasks(prefix: str, split: str, n: int, seed: int, key: str, value: str) -> list[Task]:
    """Tasks of a third-party game or page whose own seed is the task seed; ``data[key] = value``
    names the game, so a task of another one is refused at reset (``check_game_task``)."""
    return [Task(id=f"{prefix}-{value}-{split}-{s}", seed=s, split=split, data={key: value})
            for s in (split_task_seed(split, i, seed) for i in range(n))]


def check_game_task(task: Task, key: str, value: str) -> None:
    """A task made for another game than this environment's: an error naming both, not a silent mix."""
    from trajtune.errors import EnvError

    if task.data.get(key, value) != value:
        raise EnvError(f"task {task.id} is a {task.data[key]!r} task, but this environment runs {value!r}")


def make_tasks(prefix: str, split: str, n: int, seed: int, build: Callable[[random.Random], dict[str, Any]]) -> list[Task]:
    """``n`` tasks whose data ``build`` draws from a RNG seeded by the task seed (deterministic)."""
    tasks = []
    for i in range(n):
        s = split_task_seed(split, i, seed)
        tasks.append(Task(id=f"{prefix}-{split}-{s}", seed=s, split=split, data=build(random.Random(s))))
    return tasks
