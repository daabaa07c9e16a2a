"""TextArena's one-player games as a trajtune ``Environment`` (optional extra ``textarena``).

TextArena (``pip install textarena``) is a collection of text games with a common interface:
``reset(num_players, seed)``, ``get_observation() -> (player, text)``, ``step(action) -> (done,
info)`` and ``close() -> (rewards, game_info)``. This module makes one game look like a
gymnasium text environment (``TextArenaGame``) and hands it to trajtune's gym adapter
(``GymTextEnv``, text actions), so the episode loop, termination and recording are the adapter's.

What the adapter adds for TextArena:

- TextArena's observation is the whole game log so far; each turn the agent is shown only the part
  it has not seen, without the echo of its own move (``[Player] ...`` lines), since the move is
  already the assistant message before it;
- the task seed is the game's seed (train seeds even, test seeds odd);
- the episode's reward is the player's reward from ``close()`` (1 for a win in most games; some
  give partial scores); success is a reward of 1. Why it ends is in ``info``: TextArena's
  ``reason`` and whether the last move was invalid (a game that rejects a move either asks again,
  within its own error allowance, or ends: both are the game's rule, counted, never a crash);
- a scripted expert for the ``GuessTheNumber`` games (binary search on the game's hints), so SFT
  data can be generated; other games have none.

Two-player games are refused with a clear error: both seats need a policy, and self-play (both
seats played by the policy being trained) is not built yet.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trajtune.envs.adapters.gym_text import GymTextEnv
from trajtune.envs.base import ResetResult, StepResult, Task, parse_env_options
from trajtune.envs.toolenv import split_task_seed
from trajtune.errors import EnvError
from trajtune.plugins import require
from trajtune.schema import Message, Trajectory

INSTALL_HINT = "pip install 'trajtune[textarena]'  (or: pip install 'textarena>=0.7.4,<0.7.5')"

INSTRUCTIONS = ("You are playing a text game. Read the game's rules and answer each turn with your move, "
                "written exactly as the game asks (e.g. inside square brackets).")

_ECHO = re.compile(r"^\[Player(?: \d+)?\].*$", re.M)


class TextArenaNotInstalledError(EnvError, ImportError):
    """The optional ``textarena`` package is missing."""


class TextArenaOptions(BaseModel):
    """Options of the ``textarena`` environment."""

    model_config = ConfigDict(extra="forbid")

    game: str = Field("GuessTheNumber-v0", description="a one-player TextArena game id (e.g. GuessTheNumber-v0, "
                                                       "TowerOfHanoi-v0, Minesweeper-v0)")
    max_turns: int = Field(30, ge=1, le=1000, description="agent turns before the episode is cut (max_turns)")
    instructions: bool = Field(True, description="open with a short system instruction (false: the game's own "
                               "text only)")


def _ta() -> Any:
    return require("textarena", TextArenaNotInstalledError, "the textarena environment", INSTALL_HINT)


def _offline(game: str, e: LookupError) -> EnvError:
    """NLTK's multi-line "Resource 'words' not found" as one line, with the download that fixes it."""
    m = re.search(r"Resource '?([\w/.-]+)'? not found", str(e))
    what = (f"NLTK resource {m.group(1)!r} (python -m nltk.downloader {m.group(1)}, once, with network)" if m
            else f"{type(e).__name__}: {str(e).strip()[:200]}")
    return EnvError(f"textarena game {game!r} needs data it cannot find offline: {what}")


def new_text(seen: str, log: str) -> str:
    """The part of TextArena's game log the agent has not seen, without its own moves' echo."""
    fresh = log[len(seen):] if log.startswith(seen) else log
    return re.sub(r"\n{3,}", "\n\n", _ECHO.sub("", fresh)).strip()


class TextArenaGame:
    """One TextArena game in gymnasium's shape: ``reset(seed) -> (obs, info)`` and ``step(action) ->
    (obs, reward, terminated, truncated, info)``, for one player."""

    def __init__(self, game: str) -> None:
        ta = _ta()
        try:
            self._make = lambda: ta.make(game)
            self._make()
        except (ValueError, KeyError) as e:
            from textarena.envs.registration import ENV_REGISTRY

            close = sorted(g for g in ENV_REGISTRY if g.split("-")[0].lower() == game.split("-")[0].lower())
            raise EnvError(f"textarena game {game!r} is not registered ({e})"
                           + (f"; did you mean {', '.join(close[:6])}?" if close else "")) from None
        except LookupError as e:  # an NLTK corpus the game loads when made, which it cannot download offline
            raise _offline(game, e) from None
        self.game = game
        self.env: Any = None
        self.seen = ""

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.env = self._make()
        try:
            self.env.reset(num_players=1, seed=seed)
        except AssertionError as e:  # TextArena asserts the number of players
            raise EnvError(f"textarena game {self.game!r} is not a one-player game ({e}); two-player games need "
                           "self-play, which trajtune does not run yet") from None
        except LookupError as e:  # an NLTK corpus the game needs and cannot download offline
            raise _offline(self.game, e) from None
        _, log = self.env.get_observation()
        self.seen = log
        return new_text("", log), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        done, _ = self.env.step(action)
        if done:
            rewards, game_info = self.env.close()
            info = dict(game_info.get(0, {}))
            reward = float(rewards.get(0, 0.0))
            info.update({"success": reward >= 1.0, "game_reward": reward})
            reason = str(info.get("reason", "")).strip()
            return f"[GAME] {reason or 'The game is over.'}", reward, True, False, info
        _, log = self.env.get_observation()
        text, self.seen = new_text(self.seen, log), log
        return text, 0.0, False, False, {}

    def render(self) -> str:
        return self.seen[-2000:]


class TextArenaEnv(GymTextEnv):
    """A one-player TextArena game through the gym adapter (see the module docstring)."""

    description = ("TextArena's one-player text games (GuessTheNumber, TowerOfHanoi, Minesweeper, ...): move in "
                   "text as the game asks; options game, max_turns (extra: textarena).")
    options_model = TextArenaOptions
    install = INSTALL_HINT

    def __init__(self, **options: Any) -> None:
        self.options = o = parse_env_options(TextArenaOptions, "textarena", options)
        super().__init__(lambda: TextArenaGame(o.game), name="textarena",
                         instructions=INSTRUCTIONS if o.instructions else "", max_turns=o.max_turns)
        self.description = type(self).description

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return [Task(id=f"textarena-{self.options.game}-{split}-{s}", seed=s, split=split,
                     data={"game": self.options.game})
                for s in (split_task_seed(split, i, seed) for i in range(n))]

    def reset(self, task: Task) -> ResetResult:
        if task.data.get("game", self.options.game) != self.options.game:
            raise EnvError(f"task {task.id} is a {task.data['game']!r} game, but this environment plays "
                           f"{self.options.game!r}")
        return super().reset(task)

    def step(self, action: Message) -> StepResult:
        if action.tool_calls:  # no tools are offered: the move is the text
            return StepResult([Message(role="user", content="[GAME] Write your move as text; there are no tools.",
                                       origin="environment")], info={"invalid_move": True})
        out = super().step(action)
        if out.done:
            out.info = {**out.info, **{k: v for k, v in self.info.items() if k in ("success", "reason",
                                                                                   "invalid_move", "turn_count")}}
        return out

    def success(self) -> bool:
        return bool(self.info.get("success"))

    def expert(self, task: Task) -> Trajectory:
        """Binary search on the game's higher/lower hints (GuessTheNumber games only)."""
        if not self.options.game.startswith("GuessTheNumber"):
            raise NotImplementedError(f"textarena game {self.options.game!r} has no scripted expert "
                                      "(GuessTheNumber games have one)")
        from trajtune.envs.runner import run_episode

        def policy(messages: list[Message], tools: list[Any]) -> Message:
            lo, hi = _range(messages)
            return Message(role="assistant", content=f"[{(lo + hi) // 2}]")

        traj = run_episode(self, task, policy)
        traj.metadata.update({"expert": True, "policy": f"expert:{self.name}", "game": self.options.game})
        return traj


def _range(messages: list[Message]) -> tuple[int, int]:
    """The range the number can still be in, from the rules ("between 1 and 20") and the hints."""
    first = next(m.text() for m in messages if m.role == "user")
    m = re.search(r"between (\d+) and (\d+)", first)
    if m is None:
        raise EnvError("GuessTheNumber expert: the rules do not say the range ('between A and B')")
    lo, hi = int(m.group(1)), int(m.group(2))
    for prev, obs in zip(messages, messages[1:]):
        if prev.role != "assistant" or obs.role != "user":
            continue
        g = re.search(r"\[(\d+)\]", prev.text())
        if g is None:
            continue
        guess, hint = int(g.group(1)), obs.text().lower()
        if "higher" in hint:
            lo = max(lo, guess + 1)
        elif "lower" in hint:
            hi = min(hi, guess - 1)
    return lo, hi
