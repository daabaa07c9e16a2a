"""Stepping environments safely in batches, and the message-level agent loop.

``step_batch`` is the one place where environment code runs on behalf of a rollout. It never
raises: each environment steps in its own daemon thread with a per-step wall-clock timeout, and
whatever goes wrong stays inside that environment's ``StepResult``:

- ``env.step`` raises, or returns something that is not a ``StepResult`` of ``Message``s
  -> ``Error: ...`` tool messages answering every call of the action, ``done=True``,
  ``termination="env_error"``;
- ``env.step`` runs past ``timeout_s`` -> the same kind of error observation with
  ``termination="timeout"``. Python threads cannot be killed, so the hung thread is abandoned
  (it is a daemon thread and cannot block interpreter exit) and the environment must not be
  used again: its state may still change under the stray thread.

Daemon threads rather than ``ThreadPoolExecutor``: a pool's workers are joined at interpreter
exit, so one hung tool would hang the whole program, and a hung worker would shrink the pool
for the rest of the run.

``run_episodes`` is the message-level agent loop (expert data generation, API-model policies,
evaluation of black-box agents). The token-level rollout in ``trajtune.rollout`` shares
``step_batch`` with it.

Reward bookkeeping (the convention used everywhere in trajtune):
    the reward returned by ``step`` for an action is stored on that **assistant** message
    (``Message.reward``) -- a per-turn reward sits at the end of the turn that earned it, which
    is where turn-level credit assignment puts it. ``Trajectory.reward`` is the sum of the
    per-turn rewards (the undiscounted return), and ``outcome`` holds ``success`` (checked on
    the environment's state) and ``termination``.

Termination reasons: ``done`` (the environment ended the episode), ``max_turns``, ``env_error``
(``reset``/``step``/``success`` raised or returned garbage), ``timeout`` (a step hung),
``policy_error`` (the policy raised or returned something that is not an assistant message).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.envs.tools import error_observations
from trajtune.errors import WorkerLost
from trajtune.schema import Message, Outcome, Provenance, ToolSpec, Trajectory, fill_call_id

Policy = Callable[[list[Message], list[ToolSpec]], Message]


@runtime_checkable
class BatchPolicy(Protocol):
    """A policy that acts for many episodes at once (e.g. one batched model call)."""

    def act_batch(self, histories: list[list[Message]], tools: list[list[ToolSpec]]) -> list[Message]: ...


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _error_result(action: Message | None, message: str, termination: str, **info: Any) -> StepResult:
    return StepResult(observations=error_observations(action, message), reward=0.0, done=True,
                      info={"error": message, **info}, termination=termination)


def _validate_result(result: Any, action: Message) -> StepResult:
    """Accept a well-formed StepResult (dict observations are coerced); anything else is env_error."""
    if not isinstance(result, StepResult):
        return _error_result(action, f"Error: environment step returned {type(result).__name__}, not StepResult",
                             "env_error")
    obs: list[Message] = []
    for o in result.observations if isinstance(result.observations, (list, tuple)) else [None]:
        if isinstance(o, Message):
            obs.append(o)
        elif isinstance(o, dict):
            try:
                obs.append(Message.model_validate(o))
            except Exception as e:  # noqa: BLE001 - any validation problem is the env's bug
                return _error_result(action, f"Error: invalid observation ({_describe(e)})", "env_error")
        else:
            return _error_result(action, f"Error: observation of type {type(o).__name__} is not a message",
                                 "env_error")
    try:
        reward = float(result.reward)
    except (TypeError, ValueError):
        return _error_result(action, f"Error: reward {result.reward!r} is not a number", "env_error")
    if reward != reward:  # NaN
        return _error_result(action, "Error: reward is NaN", "env_error")
    termination = result.termination or ("done" if result.done else None)
    return StepResult(observations=obs, reward=reward, done=bool(result.done or result.termination),
                      info=dict(result.info or {}), termination=termination)


def _call_with_timeout(fns: Sequence[Callable[[], Any]], timeout_s: float, max_workers: int
                       ) -> list[tuple[str, Any]]:
    """Run zero-argument callables in daemon threads, at most ``max_workers`` at a time.

    Returns, per callable, ``("ok", value)``, ``("error", exception)`` or ``("timeout", None)``.
    A timed-out thread stops counting against ``max_workers`` (it is abandoned).
    """
    n = len(fns)
    max_workers = max(1, int(max_workers))
    out: list[tuple[str, Any] | None] = [None] * n
    cond = threading.Condition()
    finished: dict[int, tuple[str, Any]] = {}
    started: dict[int, float] = {}
    next_i = 0

    def worker(i: int) -> None:
        try:
            res: tuple[str, Any] = ("ok", fns[i]())
        except BaseException as e:  # noqa: BLE001 - reported, never raised
            res = ("error", e)
        with cond:
            finished[i] = res
            cond.notify_all()

    with cond:
        while True:
            while next_i < n and len(started) < max_workers:
                started[next_i] = time.monotonic()
                threading.Thread(target=worker, args=(next_i,), daemon=True,
                                 name=f"trajtune-env-{next_i}").start()
                next_i += 1
            now = time.monotonic()
            for i in list(started):
                if i in finished:
                    out[i] = finished.pop(i)
                    del started[i]
                elif now - started[i] >= timeout_s:
                    out[i] = ("timeout", None)
                    del started[i]
            if next_i >= n and not started:
                break
            if any(i in finished for i in started) or (next_i < n and len(started) < max_workers):
                continue
            deadline = min(started[i] + timeout_s for i in started)
            cond.wait(timeout=max(0.0, deadline - time.monotonic()) + 1e-3)
    return [o if o is not None else ("timeout", None) for o in out]


def step_batch(envs: Sequence[Environment], actions: Sequence[Message], *, timeout_s: float = 30.0,
               max_workers: int = 8) -> list[StepResult]:
    """Step ``envs[i]`` with ``actions[i]`` concurrently; never raises (see module docstring)."""
    if len(envs) != len(actions):
        raise ValueError(f"step_batch got {len(envs)} environments but {len(actions)} actions")
    fns = [(lambda e=e, a=a: e.step(a)) for e, a in zip(envs, actions)]
    results: list[StepResult] = []
    for (status, value), action in zip(_call_with_timeout(fns, timeout_s, max_workers), actions):
        if status == "ok":
            results.append(_validate_result(value, action))
        elif status == "error":
            if isinstance(value, WorkerLost):  # the infrastructure, not the environment: stop the run
                raise value
            results.append(_error_result(action, f"Error: {_describe(value)}", "env_error",
                                         exception=type(value).__name__))
        else:
            results.append(_error_result(action, f"Error: the environment did not answer within {timeout_s:g}s",
                                         "timeout"))
    return results


# ---------------------------------------------------------------------------------------------
# The message-level agent loop


def normalize_action(msg: Any, taken_ids: set[str]) -> Message:
    """Check a policy's output is an assistant message and give every tool call a unique id."""
    if isinstance(msg, dict):
        msg = Message.model_validate(msg)
    if not isinstance(msg, Message):
        raise TypeError(f"policy returned {type(msg).__name__}, expected an assistant Message")
    if msg.role != "assistant":
        raise TypeError(f"policy returned a {msg.role!r} message, expected 'assistant'")
    msg = msg.model_copy(deep=True)
    msg.origin = msg.origin or "agent"
    for c in msg.tool_calls or []:
        if not c.id or c.id in taken_ids:
            fill_call_id(c, taken_ids, len(taken_ids))
        taken_ids.add(c.id)
    return msg


@dataclass
class _Live:
    """The growing record of one episode in progress (shared by the batched and single-episode loops).
    A finished one is a ``Trajectory``; ``rollout.Episode`` is the one finished-episode class, and
    ``rollout._Live`` is this record's token-level counterpart."""

    env: Environment
    task: Task
    messages: list[Message] = field(default_factory=list)
    tools: list[ToolSpec] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    termination: str | None = None
    error: str | None = None
    turns: int = 0
    call_ids: set[str] = field(default_factory=set)
    feedback: str | None = None  # the verifier's summary (a step's info["feedback"]; FAFT trains on it)

    @property
    def active(self) -> bool:
        return self.termination is None

    def start(self, reset: tuple[str, Any]) -> None:
        status, value = reset
        if status == "ok" and isinstance(value, ResetResult):
            self.messages = list(value.messages)
            self.tools = list(value.tools)
        elif status == "timeout":
            self.termination, self.error = "timeout", "reset did not finish in time"
        else:
            detail = _describe(value) if isinstance(value, BaseException) else f"reset returned {type(value).__name__}"
            self.termination, self.error = "env_error", detail

    def record(self, action: Message, result: StepResult) -> None:
        action.reward = result.reward
        self.messages.append(action)
        self.messages.extend(result.observations)
        self.rewards.append(result.reward)
        self.turns += 1
        if isinstance(result.info.get("feedback"), str):
            self.feedback = result.info["feedback"]
        if result.done:
            self.termination = result.termination or "done"
            if result.termination in ("env_error", "timeout"):
                self.error = str(result.info.get("error", ""))

    def finish(self, policy_name: str | None = None) -> Trajectory:
        success: bool | None = None
        if self.termination not in ("timeout",):  # a hung env may still be mutating; do not touch it
            try:
                success = bool(self.env.success())
            except Exception as e:  # noqa: BLE001
                success, self.error = None, self.error or f"success() raised {_describe(e)}"
        final = next((m.text() for m in reversed(self.messages) if m.role == "assistant" and not m.tool_calls), None)
        meta: dict[str, Any] = {"env": self.env.name, "task_id": self.task.id, "seed": self.task.seed,
                                "split": self.task.split, "turns": self.turns}
        if self.error:
            meta["error"] = self.error
        if policy_name:
            meta["policy"] = policy_name
        if self.feedback is not None:
            meta["feedback"] = self.feedback
        return Trajectory(
            id=self.task.id if self.task.id.startswith(f"{self.env.name}-") else f"{self.env.name}-{self.task.id}",
            messages=self.messages, tools=self.tools, metadata=meta,
            reward=float(sum(self.rewards)),
            outcome=Outcome(success=success, final_answer=final or None, termination=self.termination),
            provenance=Provenance(source_format="trajtune-rollout", converter="trajtune.envs.runner",
                                  dataset=f"env:{self.env.name}"),
        )


def _policy_name(policy: Any) -> str:
    return getattr(policy, "name", None) or getattr(policy, "__name__", None) or type(policy).__name__


def run_episodes(env_factory: Callable[[], Environment], tasks: Sequence[Task], policy: Policy | BatchPolicy, *,
                 max_turns: int | None = None, timeout_s: float = 30.0, max_workers: int = 8) -> list[Trajectory]:
    """Run one episode per task with ``policy`` and return the recorded IR trajectories (in task order).

    ``env_factory()`` makes a fresh environment per task. ``policy`` is either a callable
    ``(messages, tools) -> assistant Message`` (called concurrently, up to ``max_workers`` at a
    time, so API policies overlap their latency) or a ``BatchPolicy`` with ``act_batch``.
    ``max_turns`` defaults to the environment's own ``max_turns``.

    Why a second loop beside ``rollout.run_rollouts``: that one drives a local model at the token
    level (ids and log-probs as sampled, KV cache), which training needs; this one drives any policy
    that only returns messages (experts, API models, black-box agents), with timeouts around resets
    and policy calls. Both step environments through ``step_batch``.
    """
    episodes = [_Live(env=env_factory(), task=t) for t in tasks]
    resets = _call_with_timeout([(lambda e=e: e.env.reset(e.task)) for e in episodes], timeout_s, max_workers)
    for ep, r in zip(episodes, resets):
        ep.start(r)
    limit = {id(ep): (max_turns if max_turns is not None else ep.env.max_turns) for ep in episodes}
    while True:
        for ep in episodes:
            if ep.active and ep.turns >= limit[id(ep)]:
                ep.termination = "max_turns"
        active = [ep for ep in episodes if ep.active]
        if not active:
            break
        actions = _act(policy, active, max_workers)
        stepping: list[tuple[_Live, Message]] = []
        for ep, (ok, act) in zip(active, actions):
            if not ok:
                ep.termination, ep.error = "policy_error", str(act)
                continue
            try:
                stepping.append((ep, normalize_action(act, ep.call_ids)))
            except Exception as e:  # noqa: BLE001
                ep.termination, ep.error = "policy_error", _describe(e)
        results = step_batch([ep.env for ep, _ in stepping], [a for _, a in stepping],
                             timeout_s=timeout_s, max_workers=max_workers)
        for (ep, action), res in zip(stepping, results):
            ep.record(action, res)
    name = _policy_name(policy)
    return [ep.finish(name) for ep in episodes]


def _act(policy: Policy | BatchPolicy, active: list[_Live], max_workers: int) -> list[tuple[bool, Any]]:
    histories = [list(ep.messages) for ep in active]
    tools = [list(ep.tools) for ep in active]
    if isinstance(policy, BatchPolicy):
        try:
            out = list(policy.act_batch(histories, tools))
        except Exception as e:  # noqa: BLE001
            return [(False, _describe(e))] * len(active)
        if len(out) != len(active):
            return [(False, f"act_batch returned {len(out)} actions for {len(active)} episodes")] * len(active)
        return [(True, a) for a in out]

    def one(i: int) -> tuple[bool, Any]:
        try:
            return True, policy(histories[i], tools[i])  # type: ignore[operator]
        except Exception as e:  # noqa: BLE001
            return False, _describe(e)

    if len(active) == 1 or max_workers <= 1:
        return [one(i) for i in range(len(active))]
    with ThreadPoolExecutor(max_workers=min(max_workers, len(active))) as pool:
        return list(pool.map(one, range(len(active))))


def run_episode(env: Environment, task: Task, policy: Policy, *, max_turns: int | None = None) -> Trajectory:
    """One episode in the calling thread, no timeout: for scripted experts and debugging. Kept beside
    ``run_episodes`` because environments' own ``expert`` methods (``ToolEnv``, fncall) play a
    scripted policy on themselves: no threads or timeouts to pay for, and it runs in the caller's thread.

    Exceptions from the environment are still recorded as ``env_error`` rather than raised.
    """
    ep = _Live(env=env, task=task)
    try:
        ep.start(("ok", env.reset(task)))
    except Exception as e:  # noqa: BLE001
        ep.start(("error", e))
    limit = max_turns if max_turns is not None else env.max_turns
    while ep.active:
        if ep.turns >= limit:
            ep.termination = "max_turns"
            break
        try:
            action = normalize_action(policy(list(ep.messages), list(ep.tools)), ep.call_ids)
        except Exception as e:  # noqa: BLE001
            ep.termination, ep.error = "policy_error", _describe(e)
            break
        try:
            res = _validate_result(env.step(action), action)
        except Exception as e:  # noqa: BLE001
            res = _error_result(action, f"Error: {_describe(e)}", "env_error")
        ep.record(action, res)
    return ep.finish(_policy_name(policy))
