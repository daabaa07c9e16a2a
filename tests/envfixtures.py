"""Objects that configs in the tests name as module:attr (tests/ is on sys.path under pytest)."""

from __future__ import annotations

MCP_SERVER = '''
try:
    from mcp.server.mcpserver import MCPServer as Server   # mcp 2.x
except ImportError:
    from mcp.server.fastmcp import FastMCP as Server       # mcp 1.x
server = Server("counter")
STATE = {"n": 0}

@server.tool()
def add(amount: int) -> str:
    """Add an amount to the counter."""
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
'''


def counter_is_target(client, task) -> float:
    text, _ = client.call_tool("get", {})
    return float(int(text) == int(task.data["target"]))


def counter_reached(client, task) -> bool:
    return counter_is_target(client, task) == 1.0


class GuessGame:
    """A gymnasium-style text game: guess a number 0-9 picked by the seed; 4 guesses."""

    def reset(self, seed=None, options=None):
        self.secret, self.n = (seed or 0) % 10, 0
        return "Guess a number from 0 to 9.", {}

    def step(self, action):
        self.n += 1
        guess = int(action) if action.strip().isdigit() else -1
        if guess == self.secret:
            return "correct", 1.0, True, False, {"won": True}
        return ("higher" if guess < self.secret else "lower"), 0.0, False, self.n >= 4, {"won": False}


class Bank:
    """A bank account."""

    def __init__(self, task=None):
        self.balance = 0

    def deposit(self, amount: int) -> str:
        """Deposit money.

        Args:
            amount: how much
        """
        self.balance += amount
        return f"balance {self.balance}"


def bank_reward(bank, task) -> float:
    return float(bank.balance == task.data["target"])


# --- reward composition (tests/test_reward_terms.py) -------------------------------------------

from trajtune.envs.home import HomeEnv  # noqa: E402


class TermsHome(HomeEnv):
    """``home`` that also reports named reward terms every step: ``calls`` (its tool calls) and
    ``steps`` (1)."""

    def step(self, action):
        res = super().step(action)
        res.info = {**res.info, "reward_terms": {"calls": float(len(action.tool_calls or [])), "steps": 1.0}}
        return res


def fails_on_give_up(traj) -> float:
    """A reward plug-in with a bug: it raises on some episodes."""
    last = next(m for m in reversed(traj.messages) if m.role == "assistant")
    if "give up" in (last.text() or ""):
        raise ValueError("cannot score a surrender")
    return 0.5


def reply_chars(traj) -> float:
    """A reward plug-in: characters the assistant wrote. An untrained model's turns, all cut at
    max_new_tokens, share their length in tokens but seldom in characters, so groups get mixed rewards
    whatever the sampled tokens are."""
    return float(sum(len(m.text() or "") for m in traj.messages if m.role == "assistant"))


def mentions_done(traj) -> float:
    """A reward plug-in: 1 if the final assistant message says Done."""
    last = next((m for m in reversed(traj.messages) if m.role == "assistant"), None)
    return float(last is not None and "Done" in (last.text() or ""))


# --- curriculum (tests/test_curriculum.py) ---------------------------------------------------

from trajtune.envs.base import Environment, ResetResult, StepResult, Task  # noqa: E402
from trajtune.schema import Message as _Message  # noqa: E402


class LevelsEnv(Environment):
    """Tasks of difficulty i % 3; any reply ends the episode as a success with reward 1."""

    name = "levels"
    deterministic = True

    def tasks(self, split, n, seed=0):
        return [Task(id=f"levels-{split}-{i}", seed=i, split=split, data={"difficulty": i % 3}) for i in range(n)]

    def reset(self, task):
        self.task = task
        return ResetResult(messages=[_Message(role="user", content=f"Say anything (level {task.data['difficulty']}).")],
                           tools=[])

    def step(self, action):
        return StepResult(observations=[], reward=1.0, done=True)

    def success(self):
        return True


class CoinLevels(LevelsEnv):
    """LevelsEnv that declares itself not deterministic (its state could not be reached by replay)."""

    deterministic = False


# --- snapshots (tests/test_snapshots.py) ------------------------------------------------------

import random as _random  # noqa: E402

from trajtune.envs.toolenv import ToolEnv  # noqa: E402


class Drift(ToolEnv):
    """Not deterministic (unseeded randomness), but it can take snapshots: bump() adds a random amount."""

    name = "drift"
    deterministic = False  # replaying bump() would draw other amounts
    max_turns = 4
    tool_names = ("bump",)
    restores = 0

    def tasks(self, split, n, seed=0):
        return [Task(id=f"drift-{split}-{i}", seed=i, split=split) for i in range(n)]

    def setup(self, task):
        self.total = 0.0

    def prompt(self, task):
        return "Bump the counter."

    def bump(self) -> str:
        """Add a random amount to the counter."""
        self.total += _random.random()
        return f"total {self.total:.6f}"

    def restore(self, state):
        type(self).restores += 1
        super().restore(state)


from trajtune.envs.base import Environment, ResetResult, StepResult, Task  # noqa: E402
from trajtune.schema import Message, Trajectory  # noqa: E402


class Chatter(Environment):
    """Every turn, tool call or text, gets an observation and the episode goes on (to max_turns): for
    multi-turn rollouts of an untrained model that writes no valid call."""

    name = "chatter"
    max_turns = 8
    deterministic = True

    def tasks(self, split, n, seed=0):
        return [Task(f"chat-{split}-{i}", seed * 100 + i, split) for i in range(n)]

    def reset(self, task):
        self.turns = 0
        return ResetResult([Message(role="user", content=f"Say something ({task.seed}).")], [])

    def step(self, action):
        """Reward: the text's length mod 3, halved (varies from sample to sample, so groups have advantages)."""
        self.turns += 1
        return StepResult([Message(role="user", content=f"noted {self.turns}", origin="environment")],
                          reward=(len(action.text()) % 3) / 2)

    def expert(self, task):
        """Four plain-text turns (no calls)."""
        return Trajectory(id=task.id, messages=[self.reset(task).messages[0],
                                                *[Message(role="assistant", content="hi") for _ in range(4)]])
