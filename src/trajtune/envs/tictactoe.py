"""``tictactoe``: the agent (X) plays against a fixed rule-based opponent (O).

The opponent wins when it can, blocks when it must, and otherwise plays a cell drawn from a
per-task RNG, so it is beatable but punishes blunders. Who moves first comes from the task.
Reward: 1 for a win, 0.5 for a draw, 0 for a loss; success (on the board) = not lost.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Generator
from typing import Any

from trajtune.envs.base import Task
from trajtune.envs.toolenv import ToolEnv, assistant_call, assistant_text, make_tasks, scripted_policy
from trajtune.envs.tools import ToolError
from trajtune.schema import Message, ToolSpec

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def winner(board: tuple[str, ...] | list[str]) -> str | None:
    for a, b, c in LINES:
        if board[a] != " " and board[a] == board[b] == board[c]:
            return board[a]
    return "draw" if " " not in board else None


def _completing(board: list[str], player: str) -> int | None:
    for line in LINES:
        vals = [board[i] for i in line]
        if vals.count(player) == 2 and vals.count(" ") == 1:
            return line[vals.index(" ")]
    return None


@functools.lru_cache(maxsize=None)
def _minimax(board: tuple[str, ...], to_move: str) -> tuple[int, int | None]:
    """(score for X, best cell) with perfect play; X maximises."""
    w = winner(board)
    if w == "X":
        return 1, None
    if w == "O":
        return -1, None
    if w == "draw":
        return 0, None
    best: tuple[int, int | None] = (-2, None) if to_move == "X" else (2, None)
    for i in range(9):
        if board[i] != " ":
            continue
        nb = board[:i] + (to_move,) + board[i + 1:]
        score, _ = _minimax(nb, "O" if to_move == "X" else "X")
        if (to_move == "X" and score > best[0]) or (to_move == "O" and score < best[0]):
            best = (score, i)
    return best


def _build(rng: random.Random) -> dict[str, Any]:
    return {"agent_first": rng.random() < 0.5, "opponent_seed": rng.randrange(1 << 30)}


class TicTacToeEnv(ToolEnv):
    """Tic-tac-toe against a fixed opponent; cells are numbered 1-9 row by row."""

    name = "tictactoe"
    description = "Tic-tac-toe as X against a fixed rule-based opponent; win 1, draw 0.5, loss 0."
    max_turns = 8
    system_prompt = ("You play tic-tac-toe as X. Cells are numbered 1-9, left to right, top to bottom. Call move "
                     "with a free cell. When the game is over, reply with one line.")
    tool_names = ("move",)

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return make_tasks("tictactoe", split, n, seed, _build)

    def setup(self, task: Task) -> None:
        self.board = [" "] * 9
        self.opp_rng = random.Random(task.data["opponent_seed"])
        if not task.data["agent_first"]:
            self._opponent_move()

    def _opponent_move(self) -> int:
        cell = _completing(self.board, "O")
        if cell is None:
            cell = _completing(self.board, "X")
        if cell is None:
            cell = self.opp_rng.choice([i for i in range(9) if self.board[i] == " "])
        self.board[cell] = "O"
        return cell

    def show(self) -> str:
        rows = [" | ".join(c if c != " " else str(3 * r + j + 1) for j, c in enumerate(self.board[3 * r:3 * r + 3]))
                for r in range(3)]
        return "\n".join(rows)

    def prompt(self, task: Task) -> str:
        first = "You move first." if task.data["agent_first"] else "O has moved."
        return f"{first} Board:\n{self.show()}"

    def move(self, cell: int) -> str:
        """Place an X.

        Args:
            cell: a free cell number from 1 to 9
        """
        if winner(self.board) is not None:
            raise ToolError("the game is over; reply to finish")
        if not 1 <= cell <= 9 or self.board[cell - 1] != " ":
            raise ToolError(f"cell {cell} is not free; free cells: {[i + 1 for i in range(9) if self.board[i] == ' ']}")
        self.board[cell - 1] = "X"
        msg = ""
        if winner(self.board) is None:
            msg = f"O plays {self._opponent_move() + 1}.\n"
        w = winner(self.board)
        end = {"X": "You won.", "O": "You lost.", "draw": "Draw."}.get(w or "", "Your move.")
        return f"{msg}{self.show()}\n{end}"

    def final_reward(self) -> float:
        return {"X": 1.0, "draw": 0.5}.get(winner(self.board) or "", 0.0)

    def success(self) -> bool:
        return self.task is not None and winner(self.board) in ("X", "draw")

    def state_view(self) -> str:
        return self.show()

    def expert_policy(self, task: Task) -> Callable[[list[Message], list[ToolSpec]], Message]:
        return scripted_policy(self._script())

    def _script(self) -> Generator[Message, str, None]:
        """Minimax on the visible board (the board is fully observable)."""
        while winner(self.board) is None:
            _, cell = _minimax(tuple(self.board), "X")
            yield assistant_call("move", cell=int(cell) + 1)  # type: ignore[arg-type]
        w = winner(self.board)
        yield assistant_text({"X": "I won.", "draw": "It's a draw.", "O": "I lost."}[w or "O"])
