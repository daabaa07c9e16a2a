"""Small environments whose verdicts a test can compute by hand from a stored trajectory, for the
wire tests (tests/test_wires_*.py). Configs name them as ``wire_envs:Class`` (tests/ is on sys.path).

- ``Reply``: one text reply per task. ``rule: parity`` succeeds when the reply has an even number of
  characters (so a sampling policy succeeds on some attempts and fails on others); ``rule: level``
  gives tasks difficulty ``i % 3`` and succeeds on level 0 only; ``rule: finish`` (``Finish``)
  succeeds whenever the agent ends its turn.
- ``Ladder``: a counter with tools ``up`` and ``reset_counter``; success means the counter is at least
  2 when the agent answers in text. Its scripted expert climbs to 2, then resets and answers, so
  the expert fails, and the policy succeeds from the state after the expert's second action
  (and only there) by answering at once.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.envs.toolenv import ToolEnv, assistant_call, assistant_text, make_tasks, scripted_policy
from trajtune.schema import Message, ToolSpec

REPLY_SYSTEM = "Reply with one short word."
REPLY_USER = "Say something."


def reply_is_even(text: str) -> bool:
    """The ``parity`` verdict, as a test recomputes it from a stored reply."""
    return len(text) % 2 == 0


class Reply(Environment):
    name = "reply"
    deterministic = True
    max_turns = 1

    def __init__(self, rule: str = "parity"):
        if rule not in ("parity", "level", "finish"):
            raise ValueError(f"rule must be parity, level or finish, got {rule!r}")
        self.rule = rule
        self.task: Task | None = None
        self.reply: str | None = None

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return [Task(id=f"reply-{split}-{i}", seed=2 * i + (split != "train"), split=split,
                     data={"difficulty": i % 3}) for i in range(n)]

    def reset(self, task: Task) -> ResetResult:
        self.task, self.reply = task, None
        return ResetResult(messages=[Message(role="system", content=REPLY_SYSTEM),
                                     Message(role="user", content=REPLY_USER)], tools=[])

    def step(self, action: Message) -> StepResult:
        self.reply = action.text()
        return StepResult(observations=[], reward=float(self.success()), done=True)

    def success(self) -> bool:
        if self.task is None or self.reply is None:
            return False
        if self.rule == "level":
            return self.task.data["difficulty"] == 0
        if self.rule == "finish":
            return True  # step() ran: the turn ended with the end-of-turn token
        return reply_is_even(self.reply)


class Finish(Reply):
    """``Reply`` with ``rule: finish`` (for commands that take an environment name without arguments)."""

    def __init__(self) -> None:
        super().__init__("finish")


class Ladder(ToolEnv):
    name = "ladder"
    max_turns = 6
    system_prompt = "Raise the counter to 2 with the tools, then reply Done."
    tool_names = ("up", "reset_counter")

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return make_tasks("ladder", split, n, seed, lambda rng: {})

    def setup(self, task: Task) -> None:
        self.counter = 0

    def prompt(self, task: Task) -> str:
        return "Raise the counter."

    def up(self) -> str:
        """Add one to the counter."""
        self.counter += 1
        return f"counter {self.counter}"

    def reset_counter(self) -> str:
        """Set the counter back to 0."""
        self.counter = 0
        return "counter 0"

    def success(self) -> bool:
        return self.task is not None and self.counter >= 2

    def expert_policy(self, task: Task) -> Callable[[list[Message], list[ToolSpec]], Message]:
        return scripted_policy(self._script())

    def _script(self) -> Generator[Message, str, None]:
        yield assistant_call("up")
        yield assistant_call("up")
        yield assistant_call("reset_counter")  # the expert's mistake: it ends at 0
        yield assistant_text("Done.")
