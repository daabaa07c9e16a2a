"""The batch runner and the message-level loop: failures stay inside their own episode."""

from __future__ import annotations

import threading
import time
from typing import Literal

import pytest

from trajtune.envs.adapters.python_tools import PythonToolsEnv
from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.envs.runner import run_episode, run_episodes, step_batch
from trajtune.envs.tools import ToolError, check_arguments, function_to_toolspec, parse_docstring
from trajtune.schema import Message, ToolCall


def call(name: str, cid: str = "c1", **args) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=cid, name=name, arguments=args)])


class Scripted(Environment):
    """Behaves according to ``mode``: ok, raise, hang, garbage."""

    name = "scripted"

    def __init__(self, mode: str = "ok", hang_s: float = 5.0):
        self.mode, self.hang_s, self.steps = mode, hang_s, 0
        self.release = threading.Event()

    def tasks(self, split, n, seed=0):
        return [Task(f"{split}-{i}", seed + i, split) for i in range(n)]

    def reset(self, task):
        return ResetResult([Message(role="user", content="go")], [])

    def step(self, action):
        self.steps += 1
        if self.mode == "raise":
            raise RuntimeError("database exploded")
        if self.mode == "hang":
            self.release.wait(self.hang_s)
        if self.mode == "garbage":
            return {"observations": 42}
        if self.mode == "badobs":
            return StepResult(observations=[object()])
        obs = [Message(role="tool", content="fine", tool_call_id=c.id) for c in action.tool_calls or []]
        return StepResult(observations=obs, reward=0.5, done=self.steps >= 2)

    def success(self):
        return self.steps >= 2


def test_step_batch_isolates_errors_and_timeouts():
    envs = [Scripted("ok"), Scripted("raise"), Scripted("hang"), Scripted("garbage"), Scripted("badobs"), Scripted("ok")]
    actions = [call("t", cid=f"id{i}") for i in range(len(envs))]
    t0 = time.monotonic()
    res = step_batch(envs, actions, timeout_s=0.5, max_workers=3)
    elapsed = time.monotonic() - t0
    envs[2].release.set()
    assert elapsed < 3.0  # the hung env did not hold up the batch beyond its timeout
    assert [r.termination for r in res] == [None, "env_error", "timeout", "env_error", "env_error", None]
    assert res[0].reward == 0.5 and not res[0].done and res[0].observations[0].text() == "fine"
    # error observations answer the call id of the failing action
    err = res[1].observations
    assert len(err) == 1 and err[0].role == "tool" and err[0].tool_call_id == "id1"
    assert err[0].text().startswith("Error:") and "database exploded" in err[0].text()
    assert res[2].done and res[2].observations[0].tool_call_id == "id2" and "0.5s" in res[2].observations[0].text()
    assert res[1].done and res[3].done


def test_step_batch_hung_workers_do_not_starve_queue():
    # 2 workers, both first envs hang: the remaining ones must still run after the timeouts.
    envs = [Scripted("hang"), Scripted("hang"), Scripted("ok"), Scripted("ok")]
    res = step_batch(envs, [call("t") for _ in envs], timeout_s=0.3, max_workers=2)
    for e in envs:
        e.release.set()
    assert [r.termination for r in res] == ["timeout", "timeout", None, None]


def test_step_batch_length_mismatch_is_a_programming_error():
    with pytest.raises(ValueError):
        step_batch([Scripted()], [])


def test_run_episodes_records_rewards_on_assistant_and_terminations():
    tasks = [Task("a", 1), Task("b", 2), Task("c", 3)]
    modes = iter(["ok", "raise", "hang"])
    envs = []

    def factory():
        e = Scripted(next(modes), hang_s=3.0)
        envs.append(e)
        return e

    def policy(messages, tools):
        return Message(role="assistant", tool_calls=[ToolCall(id="", name="t", arguments={})])

    trajs = run_episodes(factory, tasks, policy, max_turns=5, timeout_s=0.4, max_workers=4)
    for e in envs:
        e.release.set()
    ok, bad, hung = trajs
    assert ok.outcome.termination == "done" and ok.outcome.success is True
    assert [m.reward for m in ok.messages if m.role == "assistant"] == [0.5, 0.5]
    assert all(m.reward is None for m in ok.messages if m.role != "assistant")
    assert ok.reward == 1.0
    # generated call ids are unique within the trajectory and answered
    ids = [c.id for m in ok.messages for c in (m.tool_calls or [])]
    assert len(set(ids)) == 2 and all(i for i in ids)
    assert [m.tool_call_id for m in ok.messages if m.role == "tool"] == ids
    assert bad.outcome.termination == "env_error" and bad.outcome.success is False and "database exploded" in bad.metadata["error"]
    assert hung.outcome.termination == "timeout" and hung.outcome.success is None
    assert ok.id == "scripted-a" and ok.metadata["task_id"] == "a"


def test_run_episodes_max_turns_and_policy_errors():
    class Never(Scripted):
        def step(self, action):
            return StepResult(observations=[], reward=0.25, done=False)

    def chatty(messages, tools):
        return Message(role="assistant", content="hmm")

    [t] = run_episodes(lambda: Never(), [Task("x", 0)], chatty, max_turns=3)
    assert t.outcome.termination == "max_turns" and len([m for m in t.messages if m.role == "assistant"]) == 3
    assert t.reward == pytest.approx(0.75)

    def broken(messages, tools):
        raise ConnectionError("teacher down")

    [t] = run_episodes(lambda: Never(), [Task("x", 0)], broken, max_turns=3)
    assert t.outcome.termination == "policy_error" and "teacher down" in t.metadata["error"]

    [t] = run_episodes(lambda: Never(), [Task("x", 0)], lambda m, tl: Message(role="user", content="x"), max_turns=3)
    assert t.outcome.termination == "policy_error"


def test_batch_policy_is_called_once_per_turn():
    calls = []

    class BP:
        def act_batch(self, histories, tools):
            calls.append(len(histories))
            return [Message(role="assistant", tool_calls=[ToolCall(id="", name="t", arguments={})]) for _ in histories]

    trajs = run_episodes(lambda: Scripted(), [Task(str(i), i) for i in range(3)], BP(), max_turns=4)
    assert calls == [3, 3] and all(t.outcome.termination == "done" for t in trajs)


# --- tools from Python functions --------------------------------------------------------------

def transfer(src: str, dst: str, amount: float, memo: str | None = None, mode: Literal["fast", "slow"] = "slow") -> str:
    """Move money between accounts.

    Args:
        src: account to take from
        dst: account to pay into; may be
            an external IBAN
        amount (float): how much
    Returns:
        a receipt
    """
    return "ok"


def test_function_to_toolspec_from_hints_and_docstring():
    spec = function_to_toolspec(transfer)
    p = spec.parameters
    assert spec.name == "transfer" and spec.description == "Move money between accounts."
    assert p["required"] == ["src", "dst", "amount"]
    assert p["properties"]["amount"] == {"type": "number", "description": "how much"}
    assert p["properties"]["dst"]["description"] == "account to pay into; may be an external IBAN"
    assert p["properties"]["memo"]["type"] == "string" and p["properties"]["memo"]["default"] is None
    assert p["properties"]["mode"]["enum"] == ["fast", "slow"]
    assert p["additionalProperties"] is False
    assert check_arguments(spec, {"src": "a", "dst": "b"}) == "missing required argument 'amount' for transfer"
    assert "unknown argument" in check_arguments(spec, {"src": "a", "dst": "b", "amount": 1, "x": 1})
    assert "must be number" in check_arguments(spec, {"src": "a", "dst": "b", "amount": "1"})
    assert "must be number" in check_arguments(spec, {"src": "a", "dst": "b", "amount": True})
    assert check_arguments(spec, {"src": "a", "dst": "b", "amount": 3}) is None  # int is a valid number
    assert "one of" in check_arguments(spec, {"src": "a", "dst": "b", "amount": 3, "mode": "warp"})
    assert parse_docstring(None) == ("", {})


class Counter:
    """A counter you can bump."""

    def __init__(self, task: Task):
        self.value = task.data.get("start", 0)
        self._secret = "hidden"

    def bump(self, by: int = 1) -> dict:
        """Add to the counter.

        Args:
            by: the increment
        """
        if by < 0:
            raise ToolError("increments must be positive")
        self.value += by
        return {"value": self.value}

    def crash(self) -> str:
        """A buggy tool."""
        raise ZeroDivisionError("oops")

    def weird(self) -> object:
        """Returns something that is not text."""
        return object()

    def _private(self) -> None:
        pass


def make_counter_env():
    return PythonToolsEnv(Counter, tasks=[Task("t1", 1, data={"prompt": "bump to 3", "start": 1}),
                                          Task("t2", 2, split="test", data={"prompt": "bump", "start": 0})],
                          reward_fn=lambda c, t: float(c.value == 3))


def test_python_tools_env_tools_errors_and_reward():
    env = make_counter_env()
    assert [t.name for t in env.static_tools()] == ["bump", "crash", "weird"]
    [task] = env.tasks("train", 5)
    assert task.id == "t1" and [t.id for t in env.tasks("test", 5)] == ["t2"]
    r = env.reset(task)
    assert [t.name for t in r.tools] == ["bump", "crash", "weird"]
    assert r.messages[-1].text() == "bump to 3"
    s = env.step(call("bump", by=-1))
    assert s.observations[0].text() == "Error: increments must be positive" and not s.done
    s = env.step(call("bump", by="two"))
    assert "must be integer" in s.observations[0].text()
    s = env.step(call("nope"))
    assert "unknown tool 'nope'" in s.observations[0].text()
    s = env.step(call("bump", by=2))
    assert s.observations[0].text() == '{"value": 3}' and s.reward == 0.0
    s = env.step(Message(role="assistant", content="done, it is 3"))
    assert s.done and s.reward == 1.0 and env.success()
    assert "value" in env.render() and "bump" in env.render()
    # a fresh episode has fresh state
    env.reset(task)
    assert env.toolbox.value == 1 and not env.success()


def test_python_tools_env_bugs_become_env_error_through_runner():
    env = make_counter_env()
    env.reset(env.tasks("train", 1)[0])
    [crash, weird] = step_batch([env, env], [call("crash", cid="a"), call("weird", cid="b")], max_workers=1)
    assert crash.termination == "env_error" and "ZeroDivisionError: oops" in crash.observations[0].text()
    assert weird.termination == "env_error" and "non-text value of type object" in weird.observations[0].text()


def test_run_episode_in_thread_and_render_default():
    env = make_counter_env()
    script = iter([call("bump", cid="", by=1), call("bump", cid="", by=1), Message(role="assistant", content="3")])
    t = run_episode(env, env.tasks("train", 1)[0], lambda m, tl: next(script))
    assert t.outcome.success and t.outcome.termination == "done" and t.reward == 1.0
    assert t.outcome.final_answer == "3"
    assert [m.role for m in t.messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]


def test_envs_package_does_not_import_torch():
    # docs/architecture.md: environments must not import torch (data tooling stays light)
    import subprocess
    import sys
    code = ("import sys, trajtune.envs, trajtune.envs.runner, trajtune.sandbox, trajtune.envs.adapters.gym_text, "
            "trajtune.envs.adapters.openai_policy, trajtune.envs.adapters.mcp_tools, trajtune.cli.generate\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
