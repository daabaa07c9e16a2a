"""Gymnasium-style text environments as trajtune environments (gymnasium itself is not needed).

Anything with ``reset()`` and ``step(action)`` in the gymnasium shape works (duck typing):

- ``reset(seed=...)`` returning ``(observation, info)`` (gymnasium) or just ``observation``
  (old gym; called without ``seed`` when it does not accept one);
- ``step(action)`` returning ``(obs, reward, terminated, truncated, info)`` (gymnasium) or
  ``(obs, reward, done, info)`` (old gym).

Two ways to act: ``action_mode="text"`` (default; text games): the assistant's text, passed
through ``action_parser``, is the action and observations come back as user-role messages
from the environment. ``action_mode="tool"``: one ``act(action)`` tool; observations come back
as tool messages, so the record looks like any other tool-calling trajectory.

Termination: ``terminated`` -> ``done``; ``truncated`` -> ``max_turns`` (gymnasium's time
limit). Observations must be text (or JSON-serialisable); anything else is an environment bug
and surfaces as ``env_error``. Success: ``info["success"]`` / ``info["is_success"]`` /
``info["won"]`` when the environment reports it, else "terminated with a positive reward";
pass ``success_fn(env, info, total_reward)`` to decide differently.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.envs.toolenv import split_task_seed
from trajtune.envs.tools import ToolReturnError, result_to_text, tool_message
from trajtune.schema import Message, ToolSpec

ACT_TOOL = ToolSpec(name="act", description="Take an action in the environment.",
                    parameters={"type": "object", "properties": {"action": {"type": "string", "description": "the action to take"}},
                                "required": ["action"], "additionalProperties": False})


def _to_text(obs: Any) -> str:
    if isinstance(obs, bytes):
        raise ToolReturnError("observation is bytes, not text")
    return result_to_text(obs) if not isinstance(obs, str) else obs


class GymTextEnv(Environment):
    """Wrap a gymnasium-style text environment (see module docstring)."""

    def __init__(self, make: Callable[[], Any], *, name: str = "gym_text", instructions: str = "",
                 action_mode: str = "text", action_parser: Callable[[str], str] | None = None,
                 success_fn: Callable[[Any, dict[str, Any], float], bool] | None = None, max_turns: int = 20):
        if action_mode not in ("text", "tool"):
            raise ValueError("action_mode must be 'text' or 'tool'")
        self.gym = make()
        self.name = name
        self.instructions = instructions
        self.action_mode = action_mode
        self.action_parser = action_parser or (lambda s: s.strip())
        self.success_fn = success_fn
        self.max_turns = max_turns
        self.description = instructions.splitlines()[0] if instructions else f"gymnasium-style text env {name}"
        self.info: dict[str, Any] = {}
        self.total = 0.0
        self.terminated = False
        self.history: list[str] = []

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return [Task(id=f"{self.name}-{split}-{s}", seed=s, split=split)
                for s in (split_task_seed(split, i, seed) for i in range(n))]

    def reset(self, task: Task) -> ResetResult:
        try:
            accepts_seed = "seed" in inspect.signature(self.gym.reset).parameters
        except (TypeError, ValueError):
            accepts_seed = False
        out = self.gym.reset(seed=task.seed) if accepts_seed else self.gym.reset()
        obs, info = (out if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict) else (out, {}))
        self.info, self.total, self.terminated, self.history = dict(info), 0.0, False, []
        msgs = []
        if self.instructions:
            msgs.append(Message(role="system", content=self.instructions, origin="system"))
        msgs.append(Message(role="user", content=_to_text(obs), origin="environment"))
        return ResetResult(messages=msgs, tools=[ACT_TOOL] if self.action_mode == "tool" else [])

    def _step_gym(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        out = self.gym.step(action)
        if len(out) == 5:
            obs, reward, terminated, truncated, info = out
        elif len(out) == 4:
            obs, reward, terminated, info = out
            truncated = bool(info.get("TimeLimit.truncated", False)) if isinstance(info, dict) else False
            terminated = terminated and not truncated
        else:
            raise TypeError(f"step() returned a {len(out)}-tuple; expected 4 or 5 items")
        self.total += float(reward)
        return _to_text(obs), float(reward), bool(terminated), bool(truncated), dict(info or {})

    def step(self, action: Message) -> StepResult:
        if self.action_mode == "tool":
            calls = action.tool_calls or []
            if not calls:
                return StepResult(observations=[], reward=0.0, done=True)  # a final text answer ends it
            obs_msgs: list[Message] = []
            reward, done, termination = 0.0, False, None
            for c in calls:
                if done:
                    obs_msgs.append(tool_message(c.id, c.name, "Error: the episode is over"))
                    continue
                if c.name != "act" or not isinstance((c.arguments or {}).get("action"), str):
                    obs_msgs.append(tool_message(c.id, c.name, "Error: call act with a string argument 'action'"))
                    continue
                text, r, term, trunc, info = self._step_gym(c.arguments["action"])  # type: ignore[index]
                obs_msgs.append(tool_message(c.id, c.name, text))
                reward, done, termination = reward + r, term or trunc, self._termination(term, trunc, info)
                self.history.append(f"{c.arguments['action']!r} -> r={r}")  # type: ignore[index]
            return StepResult(observations=obs_msgs, reward=reward, done=done, termination=termination if done else None)
        act = self.action_parser(action.text())
        text, r, term, trunc, info = self._step_gym(act)
        self.history.append(f"{act!r} -> r={r}")
        done = term or trunc
        return StepResult(observations=[Message(role="user", content=text, origin="environment")], reward=r,
                          done=done, termination=self._termination(term, trunc, info) if done else None)

    def _termination(self, term: bool, trunc: bool, info: dict[str, Any]) -> str | None:
        self.info = info
        if term:
            self.terminated = True
        return "done" if term else ("max_turns" if trunc else None)

    def success(self) -> bool:
        if self.success_fn is not None:
            return bool(self.success_fn(self.gym, self.info, self.total))
        for key in ("success", "is_success", "won"):
            if key in self.info:
                return bool(self.info[key])
        return self.terminated and self.total > 0

    def render(self) -> str:
        head = f"[{self.name}] total_reward={self.total} terminated={self.terminated}"
        if hasattr(self.gym, "render"):
            try:
                view = self.gym.render()
                if isinstance(view, str):
                    head += "\n" + view
            except Exception:  # noqa: BLE001 - rendering is best effort
                pass
        return "\n".join([head] + [f"  {h}" for h in self.history[-10:]])
