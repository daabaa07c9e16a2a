"""Adapters: gymnasium-style text envs, MCP tool servers (real stdio server), OpenAI-compatible policy."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trajtune.envs.adapters.gym_text import GymTextEnv
from trajtune.envs.adapters.openai_policy import OpenAIChatPolicy, PolicyError, from_openai_message, to_openai_messages
from trajtune.envs.adapters.python_tools import PythonToolsEnv
from trajtune.envs.base import Task
from trajtune.envs.runner import run_episodes, step_batch
from trajtune.schema import Message, ToolCall


# --- gymnasium-style text environments -------------------------------------------------------

class GuessGame:
    """Gymnasium API: guess a number 0-9; the seed picks it; 4 guesses then truncation."""

    def reset(self, seed=None, options=None):
        self.secret, self.n = (seed or 0) % 10, 0
        return "Guess a number from 0 to 9.", {}

    def step(self, action):
        self.n += 1
        if action == "object":
            return object(), 0.0, False, False, {}
        guess = int(action) if action.isdigit() else -1
        if guess == self.secret:
            return "correct", 1.0, True, False, {"won": True}
        hint = "higher" if guess < self.secret else "lower"
        return hint, -0.1, False, self.n >= 4, {"won": False}

    def render(self):
        return f"secret={self.secret}"


class OldGym:
    """Old gym API: reset() -> obs, step -> 4-tuple."""

    def reset(self):
        self.t = 0
        return "start"

    def step(self, action):
        self.t += 1
        return f"t={self.t}", 1.0, self.t >= 2, {}


def _bisect(messages, tools):
    lo, hi = 0, 9
    guesses = []
    for m in messages:
        if m.role == "assistant":
            g = int(m.text() if not m.tool_calls else m.tool_calls[0].arguments["action"])
            guesses.append(g)
    for g, m in zip(guesses, [m for m in messages if m.role in ("user", "tool") and m.text() in ("higher", "lower")]):
        lo, hi = (g + 1, hi) if m.text() == "higher" else (lo, g - 1)
    guess = (lo + hi) // 2
    if tools:
        return Message(role="assistant", tool_calls=[ToolCall(id="", name="act", arguments={"action": str(guess)})])
    return Message(role="assistant", content=str(guess))


@pytest.mark.parametrize("mode", ["text", "tool"])
def test_gym_text_env_both_action_modes(mode):
    env = GymTextEnv(GuessGame, name="guess", action_mode=mode, instructions="Play the guessing game.")
    tasks = env.tasks("train", 3) + env.tasks("test", 2)
    trajs = run_episodes(lambda: GymTextEnv(GuessGame, name="guess", action_mode=mode), tasks, _bisect, max_turns=8)
    for task, t in zip(tasks, trajs):
        # bisection finds any number in 0-9 within 4 guesses
        assert t.outcome.termination == "done" and t.outcome.success, (task, t.metadata)
        assert t.reward == pytest.approx(1.0 - 0.1 * (len([m for m in t.messages if m.role == "assistant"]) - 1))
        obs_role = "tool" if mode == "tool" else "user"
        assert t.messages[-1].role == obs_role and t.messages[-1].text() == "correct"


def test_gym_truncation_is_max_turns_and_old_api_works():
    env = GymTextEnv(GuessGame, name="guess")
    env.reset(Task("t", seed=7))
    results = [env.step(Message(role="assistant", content="0")) for _ in range(4)]
    assert [r.done for r in results] == [False, False, False, True] and results[-1].termination == "max_turns"
    assert not env.success() and "secret=7" in env.render()
    old = GymTextEnv(OldGym, name="old")
    r0 = old.reset(Task("t", 0))
    assert r0.messages[-1].text() == "start"
    r = [old.step(Message(role="assistant", content="go")) for _ in range(2)]
    assert r[1].done and r[1].termination == "done" and old.success()  # terminated with positive reward


def test_gym_non_text_observation_is_env_error():
    env = GymTextEnv(GuessGame, name="guess")
    env.reset(Task("t", 3))
    [res] = step_batch([env], [Message(role="assistant", content="object")])
    assert res.termination == "env_error" and "non-text value of type object" in res.observations[0].text()


def test_gym_tool_mode_rejects_bad_calls():
    env = GymTextEnv(GuessGame, name="guess", action_mode="tool")
    env.reset(Task("t", 3))
    r = env.step(Message(role="assistant", tool_calls=[ToolCall(id="a", name="act", arguments={"action": 3})]))
    assert r.observations[0].text().startswith("Error: call act") and not r.done


# --- MCP -----------------------------------------------------------------------------------------

SERVER = textwrap.dedent('''
    try:
        from mcp.server.mcpserver import MCPServer as Server   # mcp 2.x
    except ImportError:
        from mcp.server.fastmcp import FastMCP as Server       # mcp 1.x
    server = Server("counter")
    STATE = {"n": 0}

    @server.tool()
    def add(amount: int) -> str:
        """Add an amount to the counter."""
        if amount < 0:
            raise ValueError("negative amounts are not allowed")
        STATE["n"] += amount
        return f"counter is {STATE['n']}"

    @server.tool()
    def get() -> int:
        """Read the counter."""
        return STATE["n"]

    @server.tool()
    def reset() -> str:
        """Reset the counter to zero."""
        STATE["n"] = 0
        return "ok"

    if __name__ == "__main__":
        server.run()
''')


@pytest.fixture(scope="module")
def mcp_env(tmp_path_factory):
    from trajtune.envs.adapters.mcp_tools import MCPToolsEnv

    path = tmp_path_factory.mktemp("mcp") / "server.py"
    path.write_text(SERVER)

    def counter(client):
        text, _ = client.call_tool("get", {})
        return int(text)

    env = MCPToolsEnv([sys.executable, str(path)], name="counter", reset_tool="reset",
                      tasks=[Task("c5", 1, data={"prompt": "Make the counter 5.", "target": 5})],
                      success_fn=lambda client, task: counter(client) == task.data["target"],
                      reward_fn=lambda client, task: float(counter(client) == task.data["target"]))
    yield env
    env.close()


def test_mcp_tools_are_listed_as_toolspecs(mcp_env):
    names = [t.name for t in mcp_env.tools]
    assert names == ["add", "get"]  # the reset tool is hidden from the agent
    add = mcp_env.tools[0]
    assert add.description == "Add an amount to the counter."
    assert add.parameters["properties"]["amount"]["type"] == "integer" and add.parameters["required"] == ["amount"]


def test_mcp_calls_are_forwarded_and_state_checked(mcp_env):
    [task] = mcp_env.tasks("train", 5)
    script = iter([
        Message(role="assistant", tool_calls=[ToolCall(id="", name="add", arguments={"amount": -1})]),
        Message(role="assistant", tool_calls=[ToolCall(id="", name="add", arguments={"amount": 2}),
                                              ToolCall(id="", name="add", arguments={"amount": 3})]),
        Message(role="assistant", tool_calls=[ToolCall(id="", name="missing", arguments={})]),
        Message(role="assistant", content="The counter is 5."),
    ])
    [t] = run_episodes(lambda: mcp_env, [task], lambda m, tl: next(script), max_turns=6, timeout_s=20)
    tool_texts = [m.text() for m in t.messages if m.role == "tool"]
    assert tool_texts[0].startswith("Error")
    assert tool_texts[1:3] == ["counter is 2", "counter is 5"]
    assert tool_texts[3].startswith("Error: unknown tool 'missing'")
    assert t.outcome.success is True and t.reward == 1.0 and t.outcome.termination == "done"
    # reset_tool gives the next episode a fresh server state
    mcp_env.reset(task)
    assert not mcp_env.success()


def test_mcp_bad_command_is_a_clear_error():
    from trajtune.envs.adapters.mcp_tools import MCPClient, MCPError

    with pytest.raises(MCPError):
        MCPClient(["/nonexistent/mcp-server-binary"], start_timeout_s=10)


# --- OpenAI-compatible endpoint as a policy ------------------------------------------------------

class Stub:
    """A scripted chat-completions server on 127.0.0.1 that records the requests."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append({"path": self.path, **body})
                stub.headers.append(dict(self.headers))
                status, payload = stub.replies.pop(0)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def completion(content=None, calls=None, finish="stop"):
    msg = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [{"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                             for i, (n, a) in enumerate(calls)]
    return 200, {"choices": [{"index": 0, "message": msg, "finish_reason": finish}]}


class Bank:
    def __init__(self):
        self.balance = 0

    def deposit(self, amount: int) -> str:
        """Deposit money.

        Args:
            amount: how much
        """
        self.balance += amount
        return f"balance {self.balance}"


def bank_env():
    return PythonToolsEnv(Bank, tasks=[Task("b", 1, data={"prompt": "Deposit 7."})],
                          reward_fn=lambda b, t: float(b.balance == 7))


def test_openai_policy_drives_an_episode_and_sends_openai_shapes():
    stub = Stub([(500, {"error": "busy"}),
                 completion(calls=[("deposit", '{"amount": 7}')], finish="tool_calls"),
                 completion(content="Deposited 7.")])
    try:
        policy = OpenAIChatPolicy(stub.url, "teacher-1", api_key="sk-test", backoff_s=0.01)
        [t] = run_episodes(bank_env, bank_env().tasks("train", 1), policy, max_turns=4)
    finally:
        stub.close()
    assert t.outcome.success and t.reward == 1.0 and t.metadata["policy"] == "openai:teacher-1"
    assert len(stub.requests) == 3  # one retry after the 500
    first, second = stub.requests[1], stub.requests[2]
    assert first["path"] == "/v1/chat/completions" and first["model"] == "teacher-1"
    assert stub.headers[1]["Authorization"] == "Bearer sk-test"
    assert first["tools"][0]["type"] == "function" and first["tools"][0]["function"]["name"] == "deposit"
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    # the second request carries the call with arguments as a JSON *string*, and the tool result
    call = second["messages"][2]["tool_calls"][0]
    assert call["id"] == "call_0" and json.loads(call["function"]["arguments"]) == {"amount": 7}
    assert second["messages"][3] == {"role": "tool", "content": "balance 7", "tool_call_id": "call_0"}
    assistant = [m for m in t.messages if m.role == "assistant"]
    assert assistant[0].tool_calls[0].arguments == {"amount": 7} and assistant[0].extra["finish_reason"] == "tool_calls"


def test_openai_policy_invalid_arguments_become_an_observation():
    stub = Stub([completion(calls=[("deposit", '{"amount": 7')]), completion(content="oops")])
    try:
        [t] = run_episodes(bank_env, bank_env().tasks("train", 1), OpenAIChatPolicy(stub.url, "m"), max_turns=4)
    finally:
        stub.close()
    call = t.messages[2].tool_calls[0]
    assert call.arguments is None and call.arguments_raw == '{"amount": 7'
    assert t.messages[3].text().startswith("Error: arguments of deposit are not valid JSON")
    assert t.outcome.success is False and t.outcome.termination == "done"


def test_openai_policy_client_errors_are_policy_errors():
    stub = Stub([(401, {"error": {"message": "bad key"}})])
    try:
        [t] = run_episodes(bank_env, bank_env().tasks("train", 1), OpenAIChatPolicy(stub.url, "m", max_retries=3), max_turns=4)
    finally:
        stub.close()
    assert t.outcome.termination == "policy_error" and "HTTP 401" in t.metadata["error"]
    with pytest.raises(PolicyError):
        OpenAIChatPolicy("http://127.0.0.1:9/v1", "m", max_retries=0, timeout_s=2)([Message(role="user", content="x")], [])


def test_openai_message_conversion_by_hand():
    msgs = [Message(role="user", content="hi"),
            Message(role="assistant", tool_calls=[ToolCall(id="x", name="f", arguments={"a": [1, "é"]})]),
            Message(role="tool", content="ok", tool_call_id="x")]
    assert to_openai_messages(msgs) == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": '{"a": [1, "é"]}'}}]},
        {"role": "tool", "content": "ok", "tool_call_id": "x"}]
    m = from_openai_message({"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                             "reasoning_content": "think"})
    assert m.content == "ab" and m.reasoning_content == "think" and m.tool_calls is None
    with pytest.raises(PolicyError):
        from_openai_message(None)


def test_openai_policy_parses_hermes_text_tool_calls_when_asked():
    text = 'Let me deposit.\n<tool_call>\n{"name": "deposit", "arguments": {"amount": 7}}\n</tool_call>'
    stub = Stub([completion(content=text), completion(content="Done.")])
    try:
        policy = OpenAIChatPolicy(stub.url, "m", text_tool_parser="hermes")
        [t] = run_episodes(bank_env, bank_env().tasks("train", 1), policy, max_turns=4)
    finally:
        stub.close()
    first = t.messages[2]
    assert first.tool_calls[0].name == "deposit" and first.tool_calls[0].arguments == {"amount": 7}
    assert "<tool_call>" not in (first.text() or "")
    assert t.outcome.success
