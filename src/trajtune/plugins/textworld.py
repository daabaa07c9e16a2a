"""TextWorld text adventures as a trajtune ``Environment`` (optional extra ``textworld``).

Games are made locally by TextWorld's own generator (``textworld.generator.make_game`` +
``compile_game``), seeded by the task, so a task id always names the same game and nothing is
downloaded. The agent acts through three tools: ``look``, ``inventory`` and ``command`` (any
text command, e.g. ``"open the chest"``); each call is one game step and its feedback comes
back as the tool result. The reward of a step is the change in TextWorld's score, so an
episode's total reward is the game's score; success means the game is won (score = max score).
A message without a tool call ends the episode (the agent gives up).

The game engine is reached through a small backend interface (``TextWorldBackend``) so the
adapter's logic can also be tested against a duck-typed fake; ``RealTextWorld`` is the one
that uses the ``textworld`` package.

Generated games are cached by (seed, sizes, TextWorld version) under ``game_dir`` (default: a
``trajtune-textworld`` folder in the system temp dir), because compiling one takes seconds and
a rollout builds a fresh environment per episode. Files are moved into place atomically, so
concurrent workers at worst generate the same deterministic game twice.

Two plug-ins (``trajtune.plugins``): the environment ``textworld`` (``TextWorldEnv``) and the eval
suite ``textworld`` (``TextWorldSuite``: ``trajtune eval --benchmark textworld`` runs its games).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Protocol

from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.errors import EnvError
from trajtune.eval.suites import EnvEvalSuite
from trajtune.plugins import require
from trajtune.schema import Message, Outcome, ToolCall, ToolSpec, Trajectory

INSTALL_HINT = ("pip install 'trajtune[textworld]'  (TextWorld 1.6-1.7 builds its game engine with gcc/make; "
                "to skip spaCy and other heavy extras: pip install --no-deps textworld==1.7.0 jericho==3.3.1 "
                "tatsu==5.8.3 hashids mementos more-itertools termcolor prompt_toolkit wcwidth networkx numpy tqdm)")

SYSTEM = ("You are playing a text adventure. Use the tools: look (describe the room), inventory "
          "(what you carry) and command (any game command, e.g. 'open the chest', 'go north', "
          "'take the key'). Reach the goal the game gives you.")

TOOLS = [
    ToolSpec(name="look", description="Describe the current room.",
             parameters={"type": "object", "properties": {}, "additionalProperties": False}),
    ToolSpec(name="inventory", description="List what you are carrying.",
             parameters={"type": "object", "properties": {}, "additionalProperties": False}),
    ToolSpec(name="command", description="Send one text command to the game, e.g. 'go east' or 'unlock door with key'.",
             parameters={"type": "object", "properties": {"command": {"type": "string", "description": "the command"}},
                         "required": ["command"], "additionalProperties": False}),
]
MAX_COMMAND_CHARS = 200


class TextWorldNotInstalledError(EnvError, ImportError):
    """The optional ``textworld`` package is missing."""


class GameSession(Protocol):
    """What we need from a running game (``textworld.start(...)`` returns one)."""

    def reset(self) -> Any: ...
    def step(self, command: str) -> tuple[Any, float, bool]: ...
    def close(self) -> None: ...


class TextWorldBackend(Protocol):
    version: str

    def make_game(self, seed: int, nb_rooms: int, nb_objects: int, quest_length: int, path: Path) -> Path: ...
    def start(self, path: Path) -> GameSession: ...


class RealTextWorld:
    """The ``textworld`` package: its generator, its compiler and its game runner."""

    def __init__(self) -> None:
        textworld = require("textworld", TextWorldNotInstalledError, "the TextWorld environment", INSTALL_HINT)
        require("textworld.generator", TextWorldNotInstalledError, "the TextWorld environment", INSTALL_HINT)
        self._tw = textworld
        self.version = str(getattr(textworld, "__version__", "unknown"))


    def make_game(self, seed: int, nb_rooms: int, nb_objects: int, quest_length: int, path: Path) -> Path:
        from textworld.generator import compile_game, make_game

        opts = self._tw.GameOptions()
        opts.seeds = seed
        opts.nb_rooms = nb_rooms
        opts.nb_objects = nb_objects
        opts.quest_length = quest_length
        opts.path = str(path)
        opts.force_recompile = True
        game = make_game(opts)
        return Path(compile_game(game, opts))

    def start(self, path: Path) -> GameSession:
        infos = self._tw.EnvInfos(score=True, max_score=True, won=True, lost=True, objective=True,
                                  description=True, inventory=True, policy_commands=True,
                                  admissible_commands=True)
        return _QuietSession(self._tw.start(str(path), request_infos=infos))


class _QuietSession:
    """jericho warns on every step that it cannot list valid actions for TextWorld's games;
    TextWorld computes admissible commands itself, so that warning is only noise."""

    _MESSAGE = "Unable to find valid actions in an unsupported game"

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def reset(self) -> Any:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=self._MESSAGE)
            return self._inner.reset()

    def step(self, command: str) -> tuple[Any, float, bool]:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=self._MESSAGE)
            return self._inner.step(command)

    def close(self) -> None:
        self._inner.close()


def _get(state: Any, key: str, default: Any = None) -> Any:
    try:
        value = state[key]
    except (KeyError, TypeError, IndexError):
        value = getattr(state, key, default)
    return default if value is None else value


_STATUS = re.compile(r"\n>.*\Z", re.S)


def clean_feedback(text: str) -> str:
    """Drop TextWorld's trailing prompt/status line (``>   -= Room =-0/3``) and blank runs."""
    text = _STATUS.sub("", text or "")
    return re.sub(r"\n{3,}", "\n\n", text).strip()


class TextWorldEnv(Environment):
    name = "textworld"
    description = "TextWorld text adventures generated locally (seeded); reward is the game score."
    max_turns = 40
    install = INSTALL_HINT

    def __init__(self, nb_rooms: int = 3, nb_objects: int = 6, quest_length: int = 4, max_steps: int = 40,
                 game_dir: str | os.PathLike[str] | None = None, backend: TextWorldBackend | None = None) -> None:
        if min(nb_rooms, quest_length) < 1 or nb_objects < 0:
            raise EnvError("textworld: nb_rooms and quest_length must be >= 1 and nb_objects >= 0")
        self.nb_rooms, self.nb_objects, self.quest_length = nb_rooms, nb_objects, quest_length
        self.max_steps = max_steps
        self.max_turns = max_steps + 1
        self.backend: TextWorldBackend = backend if backend is not None else RealTextWorld()
        base = Path(game_dir) if game_dir is not None else Path(tempfile.gettempdir()) / "trajtune-textworld"
        self.game_dir = base / f"textworld-{self.backend.version}"
        self.session: GameSession | None = None
        self.task: Task | None = None
        self.state: Any = None

    # -- tasks and games ----------------------------------------------------------------

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        """Train games use even generator seeds and test games odd ones: never the same game."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        rng = random.Random(f"textworld-{seed}-{split}")
        offset = 0 if split == "train" else 1
        seeds: list[int] = []
        while len(seeds) < n:
            s = 2 * rng.randrange(1 << 20) + offset
            if s not in seeds:
                seeds.append(s)
        sizes = {"nb_rooms": self.nb_rooms, "nb_objects": self.nb_objects, "quest_length": self.quest_length}
        return [Task(id=f"textworld-{split}-{s}-r{self.nb_rooms}o{self.nb_objects}q{self.quest_length}",
                     seed=s, split=split, data=dict(sizes)) for s in seeds]

    def game_path(self, task: Task) -> Path:
        """Generate (once) and return the compiled game for ``task``."""
        d = task.data
        rooms = d.get("nb_rooms", self.nb_rooms)
        objects = d.get("nb_objects", self.nb_objects)
        quest = d.get("quest_length", self.quest_length)
        name = f"tw-s{task.seed}-r{rooms}-o{objects}-q{quest}"
        final = self.game_dir / f"{name}.z8"
        if final.is_file():
            return final
        self.game_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=self.game_dir))
        try:
            made = self.backend.make_game(task.seed, rooms, objects, quest, work / f"{name}.z8")
            # Move every companion file (the .json the runner reads for infos) before the game
            # itself, so a reader that sees the .z8 also sees its metadata.
            for f in sorted(made.parent.iterdir(), key=lambda p: p.suffix == made.suffix):
                if f.is_file():
                    os.replace(f, self.game_dir / f.name)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return self.game_dir / made.name

    # -- episode ------------------------------------------------------------------------

    def reset(self, task: Task) -> ResetResult:
        self.close()
        self.task = task
        self.session = self.backend.start(self.game_path(task))
        self.state = self.session.reset()
        self.score = float(_get(self.state, "score", 0) or 0)
        self.max_score = float(_get(self.state, "max_score", 0) or 0)
        self.won = bool(_get(self.state, "won", False))
        self.lost = bool(_get(self.state, "lost", False))
        self.finished = False
        self.steps = 0
        self.last_feedback = ""
        objective = str(_get(self.state, "objective", "") or "")
        description = clean_feedback(str(_get(self.state, "description", "") or ""))
        intro = "\n\n".join(p for p in (objective.strip(), description) if p) or clean_feedback(
            str(_get(self.state, "feedback", "")))
        return ResetResult(messages=[Message(role="system", content=SYSTEM),
                                     Message(role="user", content=intro, origin="environment")],
                           tools=list(TOOLS))

    def _command_for(self, call: ToolCall) -> tuple[str | None, str | None]:
        """(game command, None) or (None, error text) for one tool call."""
        args = call.arguments if call.arguments is not None else None
        if args is None:
            return None, "error: arguments must be a JSON object"
        if call.name in ("look", "inventory"):
            if args:
                return None, f"error: {call.name} takes no arguments"
            return call.name, None
        if call.name == "command":
            cmd = args.get("command")
            if set(args) != {"command"} or not isinstance(cmd, str) or not cmd.strip():
                return None, "error: command takes one non-empty string argument 'command'"
            if len(cmd) > MAX_COMMAND_CHARS or "\n" in cmd:
                return None, f"error: a command is one line of at most {MAX_COMMAND_CHARS} characters"
            return cmd.strip(), None
        return None, f"error: unknown tool {call.name!r}; use look, inventory or command"

    def step(self, action: Message) -> StepResult:
        if self.session is None:
            raise RuntimeError("call reset() before step()")
        if self.finished:
            return StepResult(observations=[], reward=0.0, done=True, info={"error": "episode already over"})
        calls = action.tool_calls or []
        if not calls:
            self.finished = True
            return StepResult(observations=[], reward=0.0, done=True,
                              info={"success": self.success(), "gave_up": not self.success(), "score": self.score})
        reward = 0.0
        obs: list[Message] = []
        game_over = False
        for c in calls:
            if game_over:
                text = "The game is over."
            else:
                cmd, error = self._command_for(c)
                if error is not None:
                    text = error
                else:
                    self.state, score, done = self.session.step(cmd)
                    score = float(score)
                    reward += score - self.score
                    self.score = score
                    self.won = bool(_get(self.state, "won", False))
                    self.lost = bool(_get(self.state, "lost", False))
                    text = clean_feedback(str(_get(self.state, "feedback", "")))
                    self.last_feedback = text
                    game_over = bool(done)
            obs.append(Message(role="tool", tool_call_id=c.id, name=c.name, content=text, origin="environment"))
        self.steps += 1
        info: dict[str, Any] = {"score": self.score, "max_score": self.max_score}
        if game_over:
            self.finished = True
            info["success"] = self.success()
            return StepResult(observations=obs, reward=reward, done=True, info=info)
        if self.steps >= self.max_steps:
            self.finished = True
            info["success"] = False
            return StepResult(observations=obs, reward=reward, done=True, termination="max_turns", info=info)
        return StepResult(observations=obs, reward=reward, done=False, info=info)

    def success(self) -> bool:
        if self.session is None:
            return False
        return bool(self.won or (self.max_score > 0 and self.score >= self.max_score))

    def expert(self, task: Task) -> Trajectory:
        """Follow TextWorld's own walkthrough (``policy_commands`` at the start of the game)."""
        reset = self.reset(task)
        walkthrough = list(_get(self.state, "policy_commands", []) or [])
        if not walkthrough:
            raise RuntimeError(f"{task.id}: TextWorld gave no walkthrough for this game")
        msgs = list(reset.messages)
        for n, cmd in enumerate(walkthrough):
            m = Message(role="assistant", origin="agent",
                        tool_calls=[ToolCall(id=f"call_{n:06d}", id_generated=True, name="command",
                                             arguments={"command": cmd})])
            msgs.append(m)
            res = self.step(m)
            msgs.extend(res.observations)
            if res.done:
                break
        ok = self.success()
        msgs.append(Message(role="assistant", origin="agent", content="Done." if ok else "I could not finish."))
        return Trajectory(id=task.id, messages=msgs, tools=list(TOOLS), reward=self.score,
                          outcome=Outcome(success=ok, final_answer=msgs[-1].text(), termination="done"),
                          metadata={"env": self.name, "seed": task.seed, "split": task.split, "expert": True,
                                    "score": self.score, "max_score": self.max_score})

    def admissible_commands(self) -> list[str]:
        """TextWorld's list of valid commands in the current state (for baselines and tests)."""
        return list(_get(self.state, "admissible_commands", []) or [])

    def render(self) -> str:
        if self.task is None:
            return "<textworld: not started>"
        return f"{self.task.id}: score {self.score:g}/{self.max_score:g}, steps {self.steps}\n{self.last_feedback}"

    def close(self) -> None:
        if self.session is not None:
            try:
                self.session.close()
            except Exception:  # noqa: BLE001 - closing a finished game must not fail a run
                pass
            self.session = None


class TextWorldSuite(EnvEvalSuite):
    """``trajtune eval --benchmark textworld``: the ``textworld`` environment's games, one suite."""

    name = "textworld"
