"""``sokoban``: small box-pushing puzzles (planning; mistakes can be irreversible).

Levels are generated per task by playing *backwards* from a solved position (pulling boxes off
their targets), then checked with a breadth-first solver, so every level is solvable and its
optimal length is known. Per-turn reward: +0.1 for each box newly on a target (-0.1 for one
pushed off); +1 when solved. Success (on state): every box on a target.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

from trajtune.envs.base import Task
from trajtune.envs.toolenv import ToolEnv, assistant_call, assistant_text, make_tasks, scripted_policy
from trajtune.envs.tools import ToolError
from trajtune.schema import Message, ToolSpec

DIRS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
Pos = tuple[int, int]


def solve(walls: frozenset[Pos], targets: frozenset[Pos], player: Pos, boxes: frozenset[Pos],
          max_states: int = 200_000) -> list[str] | None:
    """Shortest move sequence that puts every box on a target (BFS), or None."""
    start = (player, boxes)
    prev: dict[Any, Any] = {start: None}
    q = deque([start])
    while q:
        state = q.popleft()
        p, bx = state
        if bx == targets:
            path = []
            while prev[state] is not None:
                state, d = prev[state]
                path.append(d)
            return path[::-1]
        for d, (dr, dc) in DIRS.items():
            np_ = (p[0] + dr, p[1] + dc)
            if np_ in walls:
                continue
            nb = bx
            if np_ in bx:
                beyond = (np_[0] + dr, np_[1] + dc)
                if beyond in walls or beyond in bx:
                    continue
                nb = (bx - {np_}) | {beyond}
            ns = (np_, nb)
            if ns not in prev:
                if len(prev) >= max_states:
                    return None
                prev[ns] = (state, d)
                q.append(ns)
    return None


def _build(rng: random.Random) -> dict[str, Any]:
    for _ in range(200):
        h, w = rng.randint(5, 7), rng.randint(5, 7)
        walls = {(r, c) for r in range(h) for c in range(w) if r in (0, h - 1) or c in (0, w - 1)}
        inner = [(r, c) for r in range(1, h - 1) for c in range(1, w - 1)]
        for cell in rng.sample(inner, rng.randint(0, 3)):
            walls.add(cell)
        free = [c for c in inner if c not in walls]
        nbox = rng.choice([1, 1, 2])
        if len(free) < nbox + 4:
            continue
        targets = set(rng.sample(free, nbox))
        boxes = set(targets)
        player = rng.choice([c for c in free if c not in boxes])
        for _ in range(rng.randint(10, 40)):  # reverse play: walk, sometimes pulling a box behind us
            dr, dc = rng.choice(list(DIRS.values()))
            to = (player[0] + dr, player[1] + dc)
            if to in walls or to in boxes:
                continue
            behind = (player[0] - dr, player[1] - dc)
            if behind in boxes and rng.random() < 0.6:
                boxes.remove(behind)
                boxes.add(player)
            player = to
        if boxes == targets:
            continue
        sol = solve(frozenset(walls), frozenset(targets), player, frozenset(boxes))
        if sol is not None and 3 <= len(sol) <= 18:
            return {"h": h, "w": w, "walls": sorted(walls), "targets": sorted(targets), "boxes": sorted(boxes),
                    "player": list(player), "optimal": len(sol)}
    raise RuntimeError("could not generate a sokoban level")  # pragma: no cover - 200 tries always suffice


class SokobanEnv(ToolEnv):
    """Small Sokoban levels; one move per tool call."""

    name = "sokoban"
    description = "Small Sokoban levels (push every box $ onto a target .); one move per call."
    max_turns = 30
    system_prompt = ("You play Sokoban. Legend: # wall, @ you, $ box, . target, * box on target, + you on a target. "
                     "Push every box onto a target with move(direction); you can push but not pull. "
                     "When the puzzle is solved, reply with one line.")
    tool_names = ("move",)

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return make_tasks("sokoban", split, n, seed, _build)

    def setup(self, task: Task) -> None:
        d = task.data
        self.walls = frozenset(tuple(x) for x in d["walls"])
        self.targets = frozenset(tuple(x) for x in d["targets"])
        self.boxes = frozenset(tuple(x) for x in d["boxes"])
        self.player: Pos = tuple(d["player"])  # type: ignore[assignment]
        self.h, self.w = d["h"], d["w"]
        self._on_before = self._on_target()

    def _on_target(self) -> int:
        return len(self.boxes & self.targets)

    def show(self) -> str:
        rows = []
        for r in range(self.h):
            row = ""
            for c in range(self.w):
                p = (r, c)
                if p in self.walls:
                    row += "#"
                elif p == self.player:
                    row += "+" if p in self.targets else "@"
                elif p in self.boxes:
                    row += "*" if p in self.targets else "$"
                else:
                    row += "." if p in self.targets else " "
            rows.append(row.rstrip())
        return "\n".join(rows)

    def prompt(self, task: Task) -> str:
        return f"Solve this level:\n{self.show()}"

    def move(self, direction: str) -> str:
        """Move one step, pushing a box if one is in the way.

        Args:
            direction: one of up, down, left, right
        """
        if direction not in DIRS:
            raise ToolError("direction must be one of up, down, left, right")
        if self.boxes == self.targets:
            raise ToolError("the puzzle is already solved; reply to finish")
        dr, dc = DIRS[direction]
        to = (self.player[0] + dr, self.player[1] + dc)
        if to in self.walls:
            raise ToolError("a wall is in the way")
        if to in self.boxes:
            beyond = (to[0] + dr, to[1] + dc)
            if beyond in self.walls or beyond in self.boxes:
                raise ToolError("the box cannot move there")
            self.boxes = (self.boxes - {to}) | {beyond}
        self.player = to
        status = "Solved!" if self.boxes == self.targets else f"{self._on_target()}/{len(self.targets)} boxes on targets."
        return f"{self.show()}\n{status}"

    def turn_reward(self, action: Message, observations: list[Message]) -> float:
        now = self._on_target()
        delta, self._on_before = now - self._on_before, now
        return 0.1 * delta

    def success(self) -> bool:
        return self.task is not None and self.boxes == self.targets

    def state_view(self) -> str:
        return self.show()

    def expert_policy(self, task: Task) -> Callable[[list[Message], list[ToolSpec]], Message]:
        return scripted_policy(self._script())

    def _script(self) -> Generator[Message, str, None]:
        """Replan with BFS from the visible position before every move."""
        while self.boxes != self.targets:
            plan = solve(self.walls, self.targets, self.player, self.boxes)
            if not plan:
                break
            yield assistant_call("move", direction=plan[0])
        yield assistant_text("Solved." if self.boxes == self.targets else "I could not solve it.")
