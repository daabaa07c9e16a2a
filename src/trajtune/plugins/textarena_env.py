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
- scripted experts, so SFT data can be generated: binary search on the hints for the
  ``GuessTheNumber`` games, perfect play by minimax for ``TicTacToe-v0``; other games have none.

Two-player games are played against a fixed opponent in the other seat (``opponent``): ``random``
(a uniformly drawn move from the game's list of available moves, seeded by the task), ``first``
(the first available move), ``openai:URL`` (an endpoint; ``opponent_model`` names the model) or a
local model such as a frozen checkpoint of the policy. The agent's seat is ``seat`` (0, 1, or
``alternate``: the seat alternates with the task seed, so evaluation sees both). The opponent reads
its own player's view of the game, and its moves happen inside ``step``; the agent's reward is its
seat's reward from ``close()`` (win 1, draw 0, loss -1 in the board games) and success is a win. An
opponent that fails (raises, hangs past ``opponent_timeout_s``, answers nothing) ends the episode as
``env_error``, never as the agent's loss.

Self-play (``opponent: self``): the policy plays both seats of one game, as two roles of one episode
(``player0``, ``player1``; ``acting_role()`` follows the game, so a seat asked to move again after an
invalid move acts again). Each turn's observation is the acting player's own view, what it has not
seen yet, under a ``[Player N to move]`` line; the players share the transcript, as in a game played
at one table. At the end each seat's reward from ``close()`` goes out in ``info["role_rewards"]``,
so RL makes a training row and a group baseline per seat (``algorithms/roles.py``; with
``rl.role_adapters`` each seat also has its own adapter). The episode's own reward is the mean of the
two seats' (0 in a zero-sum game such as TicTacToe, where a seat that runs out of invalid moves loses
and the other wins) and success is a game played to its end without an invalid move. To measure the
trained policy, play it against a frozen copy: in self-play with one seat's adapter frozen, or with
``opponent`` a model.
"""

from __future__ import annotations

import random
import re
from functools import cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trajtune.envs.adapters.gym_text import GymTextEnv
from trajtune.envs.base import ResetResult, StepResult, Task, parse_env_options
from trajtune.envs.toolenv import check_game_task, game_tasks
from trajtune.errors import EnvError
from trajtune.plugins import missing_nltk_resource, require
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

    game: str = Field("GuessTheNumber-v0", description="a TextArena game id (one-player: GuessTheNumber-v0, "
                                                       "TowerOfHanoi-v0, ...; two-player, with opponent: "
                                                       "TicTacToe-v0, ConnectFour-v0, Nim-v0, ...)")
    max_turns: int = Field(30, ge=1, le=1000, description="agent turns before the episode is cut (max_turns)")
    instructions: bool = Field(True, description="open with a short system instruction (false: the game's own "
                               "text only)")
    opponent: str | None = Field(None, description="two-player games: who plays the other seat (random, first, "
                                 "openai:URL, a local model such as a frozen checkpoint, or self: the policy plays "
                                 "both seats); None: one-player games")
    opponent_model: str = Field("", description="the model's name at an openai:URL opponent")
    seat: Literal[0, 1, "alternate"] = Field("alternate", description="the agent's seat in a two-player game "
                                             "(alternate: (task seed // 2) % 2, so both seats are played)")
    opponent_timeout_s: float = Field(60.0, gt=0, description="seconds the opponent may take per move")

    @model_validator(mode="after")
    def _self_play(self) -> "TextArenaOptions":
        if self.opponent == "self":
            unused = sorted({"seat", "opponent_model", "opponent_timeout_s"} & self.model_fields_set)
            if unused:
                raise ValueError(f"{', '.join(unused)} mean nothing in self-play (opponent: self): the policy plays "
                                 "both seats")
        return self


def _ta() -> Any:
    return require("textarena", TextArenaNotInstalledError, "the textarena environment", INSTALL_HINT)


def _offline(game: str, e: LookupError) -> EnvError:
    """NLTK's multi-line "Resource 'words' not found" as one line, with the download that fixes it."""
    name = missing_nltk_resource(e)
    what = (f"NLTK resource {name!r} (python -m nltk.downloader {name}, once, with network)" if name
            else f"{type(e).__name__}: {str(e).strip()[:200]}")
    return EnvError(f"textarena game {game!r} needs data it cannot find offline: {what}")


def new_text(seen: str, log: str) -> str:
    """The part of TextArena's game log the agent has not seen, without its own moves' echo."""
    fresh = log[len(seen):] if log.startswith(seen) else log
    return re.sub(r"\n{3,}", "\n\n", _ECHO.sub("", fresh)).strip()


_MOVES = re.compile(r"Available Moves:\s*(.+)")


def available_moves(text: str) -> list[str]:
    """The moves the game's last "Available Moves:" line offers ('[0]', '[1]', ... -> [0], [1], ...)."""
    found = _MOVES.findall(text)
    return re.findall(r"'([^']+)'", found[-1]) if found else []


class Opponent:
    """The other seat of a two-player game (see the module docstring); ``move(view, seed)`` -> the move."""

    def __init__(self, spec: str, *, model: str = "", timeout_s: float = 60.0):
        self.spec, self.timeout_s = spec, timeout_s
        self.writer = None
        if spec not in ("random", "first"):
            from trajtune.envs.adapters.simulated_user import make_user

            self.writer = make_user(spec, user_model=model, max_new_tokens=32, timeout_s=timeout_s)
        self.rng = random.Random(0)
        self.name = spec

    def start(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def move(self, view: str) -> str:
        if self.writer is None:
            moves = available_moves(view)
            if not moves:
                raise EnvError(f"opponent {self.spec!r} needs a game that lists its moves ('Available Moves: ...'); "
                               "give a model as the opponent for this game")
            return moves[0] if self.spec == "first" else self.rng.choice(moves)
        from trajtune.envs.adapters.simulated_user import (
            UserSession,
            UserSimulatorError,
        )

        session = UserSession(self.writer, {}, timeout_s=self.timeout_s, role="opponent", system=INSTRUCTIONS)
        try:
            return session.reply(view[-4000:])[0]
        except UserSimulatorError as e:
            raise EnvError(f"textarena: {e}") from None


class TextArenaGame:
    """One TextArena game in gymnasium's shape: ``reset(seed) -> (obs, info)`` and ``step(action) ->
    (obs, reward, terminated, truncated, info)``, for the agent's seat (the opponent, in a two-player
    game, moves inside ``reset`` and ``step``)."""

    def __init__(self, game: str, opponent: Opponent | None = None, seat: int | str = 0,
                 selfplay: bool = False) -> None:
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
        self.opponent = opponent
        self.seat_option = seat
        self.seat = 0
        self.env: Any = None
        self.seen = ""
        self.opponent_moves: list[str] = []
        self.selfplay = selfplay
        self.seen_by: dict[int, str] = {}  # self-play: each player's view so far
        self.acting = 0  # self-play: the player to move

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.env = self._make()
        players = 2 if self.opponent is not None or self.selfplay else 1
        self.seat = 0 if self.opponent is None else (
            ((seed or 0) // 2) % 2 if self.seat_option == "alternate" else int(self.seat_option))
        self.opponent_moves = []
        try:
            self.env.reset(num_players=players, seed=seed)
        except AssertionError as e:  # TextArena asserts the number of players
            hint = ("; a two-player game needs an opponent (--env-arg opponent=random, or a model)" if players == 1
                    else "; without an opponent option it is played alone")
            raise EnvError(f"textarena game {self.game!r} cannot be played by {players} player(s) ({e}){hint}") \
                from None
        except LookupError as e:  # an NLTK corpus the game needs and cannot download offline
            raise _offline(self.game, e) from None
        if self.selfplay:
            self.seen_by = {}
            return self._view(), {}
        if self.opponent is not None:
            self.opponent.start(seed or 0)
            if self._opponent_plays():
                raise EnvError(f"textarena game {self.game!r} ended before the agent's first move "
                               f"(opponent moves {self.opponent_moves})")
        _, log = self.env.get_observation()
        self.seen = log
        return new_text("", log), {}

    def _view(self) -> str:
        """Self-play: what the player to move has not seen yet, under a line that says who moves."""
        pid, log = self.env.get_observation()
        text = new_text(self.seen_by.get(pid, ""), log)
        self.seen_by[pid], self.acting = log, int(pid)
        return f"[Player {pid} to move]\n{text}"

    def _opponent_plays(self) -> bool:
        """The opponent moves until it is the agent's turn; True when the game ended meanwhile."""
        while True:
            pid, view = self.env.get_observation()
            if pid == self.seat:
                return False
            move = self.opponent.move(view)  # type: ignore[union-attr]
            self.opponent_moves.append(move)
            done, _ = self.env.step(move)
            if done:
                return True

    def _over(self) -> tuple[str, float, bool, bool, dict[str, Any]]:
        rewards, game_info = self.env.close()
        if self.selfplay:
            seats = {f"player{s}": float(rewards.get(s, 0.0)) for s in (0, 1)}
            invalid = any(bool(game_info.get(s, {}).get("invalid_move")) for s in (0, 1))
            reason = next((str(g.get("reason", "")).strip() for g in game_info.values() if g.get("reason")), "")
            info = {"role_rewards": seats, "invalid_move": invalid, "success": not invalid, "reason": reason,
                    "game_reward": sum(seats.values()) / 2}
            return f"[GAME] {reason or 'The game is over.'}", info["game_reward"], True, False, info
        info = dict(game_info.get(self.seat, {}))
        reward = float(rewards.get(self.seat, 0.0))
        info.update({"success": reward >= 1.0, "game_reward": reward})
        if self.opponent is not None:
            info.update({"seat": self.seat, "opponent": self.opponent.name,
                         "opponent_invalid_move": bool(game_info.get(1 - self.seat, {}).get("invalid_move"))})
        reason = str(info.get("reason", "")).strip()
        return f"[GAME] {reason or 'The game is over.'}", reward, True, False, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        done, _ = self.env.step(action)
        if done or (self.opponent is not None and self._opponent_plays()):
            return self._over()
        if self.selfplay:
            return self._view(), 0.0, False, False, {}
        _, log = self.env.get_observation()
        text, self.seen = new_text(self.seen, log), log
        return text, 0.0, False, False, {}

    def render(self) -> str:
        return self.seen[-2000:]


class TextArenaEnv(GymTextEnv):
    """A one-player TextArena game through the gym adapter (see the module docstring)."""

    description = ("TextArena's text games (GuessTheNumber, TowerOfHanoi, Minesweeper, ...; two-player ones such as "
                   "TicTacToe against a fixed opponent or in self-play): move in text as the game asks; options game, "
                   "opponent, seat, max_turns (extra: textarena).")
    options_model = TextArenaOptions
    install = INSTALL_HINT

    def __init__(self, **options: Any) -> None:
        self.options = o = parse_env_options(TextArenaOptions, "textarena", options)
        selfplay = o.opponent == "self"
        opponent = None if o.opponent is None or selfplay else Opponent(o.opponent, model=o.opponent_model,
                                                                        timeout_s=o.opponent_timeout_s)
        super().__init__(lambda: TextArenaGame(o.game, opponent, o.seat, selfplay), name="textarena",
                         instructions=INSTRUCTIONS if o.instructions else "", max_turns=o.max_turns)
        self.description = type(self).description
        self.roles = ("player0", "player1") if selfplay else ()

    def acting_role(self) -> str | None:
        """Self-play: the seat the game asks to move (module docstring); None otherwise."""
        return f"player{self.gym.acting}" if self.roles else None

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return game_tasks("textarena", split, n, seed, "game", self.options.game)

    def reset(self, task: Task) -> ResetResult:
        check_game_task(task, "game", self.options.game)
        return super().reset(task)

    def step(self, action: Message) -> StepResult:
        if action.tool_calls:  # no tools are offered: the move is the text
            return StepResult([Message(role="user", content="[GAME] Write your move as text; there are no tools.",
                                       origin="environment")], info={"invalid_move": True})
        out = super().step(action)
        if out.done:
            out.info = {**out.info, **{k: v for k, v in self.info.items() if k in (
                "success", "reason", "invalid_move", "turn_count", "seat", "opponent", "opponent_invalid_move",
                "role_rewards")}}
        return out

    def success(self) -> bool:
        return bool(self.info.get("success"))

    def expert(self, task: Task) -> Trajectory:
        """Binary search on the game's higher/lower hints (GuessTheNumber games), perfect play by minimax
        on the board the agent was shown (TicTacToe-v0, against an opponent or in self-play: both seats)."""
        game = self.options.game
        if not (game.startswith("GuessTheNumber") or game == "TicTacToe-v0"):
            raise NotImplementedError(f"textarena game {game!r} has no scripted expert "
                                      "(GuessTheNumber games and TicTacToe-v0 have one)")
        from trajtune.envs.runner import run_episode

        def policy(messages: list[Message], tools: list[Any]) -> Message:
            if game == "TicTacToe-v0":
                return Message(role="assistant", content=f"[{tictactoe_move(messages)}]")
            lo, hi = _range(messages)
            return Message(role="assistant", content=f"[{(lo + hi) // 2}]")

        traj = run_episode(self, task, policy)
        traj.metadata.update({"expert": True, "policy": f"expert:{self.name}", "game": self.options.game})
        return traj


_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


def _winner(b: tuple[str, ...]) -> str | None:
    return next((b[i] for i, j, k in _LINES if b[i] in "XO" and b[i] == b[j] == b[k]), None)


@cache
def _minimax(b: tuple[str, ...], me: str, turn: str) -> int:
    """+1 if ``me`` wins with perfect play from board ``b`` with ``turn`` to move, 0 a draw, -1 a loss."""
    w = _winner(b)
    if w is not None:
        return 1 if w == me else -1
    free = [i for i, c in enumerate(b) if c not in "XO"]
    if not free:
        return 0
    other = "O" if turn == "X" else "X"
    scores = [_minimax(b[:i] + (turn,) + b[i + 1:], me, other) for i in free]
    return max(scores) if turn == me else min(scores)


def tictactoe_move(messages: list[Message], rng: random.Random | None = None) -> int:
    """The best cell for the agent on the last board it was shown: the lowest of equally good ones, or
    one drawn by ``rng`` among them (varied perfect play, for SFT data in which games differ)."""
    text = "\n".join(m.text() for m in messages if m.role == "user")
    last = next((m.text() for m in reversed(messages) if m.role == "user"), "")
    head = re.match(r"\[Player (\d) to move\]", last)  # self-play: the seat to move, whose mark counts
    mark = re.search(rf"As Player {head.group(1)}, you will be '([XO])'" if head else r"you will be '([XO])'", text)
    rows = re.findall(r"^ (\S) \| (\S) \| (\S) $", text, re.M)[-3:]
    if mark is None or len(rows) != 3:
        raise EnvError("TicTacToe expert: the game text has no mark ('you will be X') or no board")
    me = mark.group(1)
    board = tuple(c for r in rows for c in r)
    other = "O" if me == "X" else "X"
    free = [i for i, c in enumerate(board) if c not in "XO"]
    value = {i: _minimax(board[:i] + (me,) + board[i + 1:], me, other) for i in free}
    best = [i for i in free if value[i] == max(value.values())]
    return rng.choice(best) if rng is not None else best[0]


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
