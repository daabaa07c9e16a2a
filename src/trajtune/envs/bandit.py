"""``bandit``: a multi-armed bandit played through a ``pull`` tool (explore, then exploit).

Each arm pays 1 with a hidden probability: one arm is clearly best (0.75-0.9), the others pay
0.1-0.4. The agent has a fixed budget of pulls. Per-turn reward is the payout of that pull, so
``Trajectory.reward`` is the total payout. Success (on state) means the agent *acted* on what it
learned: its most-pulled arm over the last four pulls is the best arm (the knowing-doing gap).
The episode ends when the agent replies in text (typically after spending the budget).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable, Generator
from typing import Any

from trajtune.envs.base import Task
from trajtune.envs.toolenv import ToolEnv, assistant_call, assistant_text, make_tasks, scripted_policy
from trajtune.envs.tools import ToolError
from trajtune.schema import Message, ToolSpec

EXPLOIT_WINDOW = 4


def _build(rng: random.Random) -> dict[str, Any]:
    k = rng.randint(3, 4)
    probs = [round(rng.uniform(0.1, 0.4), 2) for _ in range(k)]
    best = rng.randrange(k)
    probs[best] = round(rng.uniform(0.75, 0.9), 2)
    return {"probs": probs, "best": best, "budget": 2 * k + EXPLOIT_WINDOW}


class BanditEnv(ToolEnv):
    """Multi-armed bandit with a pull budget; per-turn reward is the payout."""

    name = "bandit"
    description = "Multi-armed bandit: pull arms (tool), find the best one and exploit it; reward = payouts."
    max_turns = 16
    system_prompt = ("You play a slot machine with several arms. Each pull pays 0 or 1. Use your pulls to find the "
                     "arm that pays most often and then keep pulling it. When you have no pulls left, reply with "
                     "which arm you think is best.")
    tool_names = ("pull",)

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return make_tasks("bandit", split, n, seed, _build)

    def setup(self, task: Task) -> None:
        self.rng = random.Random(task.seed * 7919 + 1)
        self.pulls: list[tuple[int, int]] = []

    def prompt(self, task: Task) -> str:
        k = len(task.data["probs"])
        return f"The machine has {k} arms, numbered 0 to {k - 1}. You have {task.data['budget']} pulls."

    def pull(self, arm: int) -> str:
        """Pull one arm of the machine.

        Args:
            arm: the arm number, starting at 0
        """
        assert self.task is not None
        probs = self.task.data["probs"]
        if not 0 <= arm < len(probs):
            raise ToolError(f"arm must be between 0 and {len(probs) - 1}")
        left = self.task.data["budget"] - len(self.pulls)
        if left <= 0:
            raise ToolError("no pulls left; reply with your conclusion")
        payout = int(self.rng.random() < probs[arm])
        self.pulls.append((arm, payout))
        return f"arm {arm} paid {payout} (pulls left: {left - 1})"

    def turn_reward(self, action: Message, observations: list[Message]) -> float:
        # the payouts of the pulls made in this turn (errors pay nothing)
        return float(sum(int(m) for o in observations for m in re.findall(r"paid (\d)", o.text())))

    def final_reward(self) -> float:
        return 0.0  # the return is the total payout; success is reported separately

    def success(self) -> bool:
        if self.task is None or len(self.pulls) < EXPLOIT_WINDOW:
            return False
        tail = Counter(a for a, _ in self.pulls[-EXPLOIT_WINDOW:]).most_common()
        return tail[0][0] == self.task.data["best"] and (len(tail) == 1 or tail[0][1] > tail[1][1])

    def state_view(self) -> str:
        return f"pulls={self.pulls}"

    def expert_policy(self, task: Task) -> Callable[[list[Message], list[ToolSpec]], Message]:
        return scripted_policy(self._script(task))

    def _script(self, task: Task) -> Generator[Message, str, None]:
        """Explore every arm twice, then exploit the empirically best (ties: lowest index)."""
        k, budget = len(task.data["probs"]), task.data["budget"]
        wins = [0] * k
        for rep in range(2):
            for arm in range(k):
                obs = yield assistant_call("pull", arm=arm)
                wins[arm] += int(re.search(r"paid (\d)", obs).group(1))  # type: ignore[union-attr]
        best = max(range(k), key=lambda a: (wins[a], -a))
        for _ in range(budget - 2 * k):
            yield assistant_call("pull", arm=best)
        yield assistant_text(f"Arm {best} paid most often ({wins[best]}/2 while exploring), so I kept pulling it.")
