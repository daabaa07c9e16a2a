"""GEM's environments as a trajtune ``Environment`` (optional extra ``gem``).

GEM (``gem-llm``, "a gym for agentic LLMs") ships games (GuessTheNumber, Mastermind, Minesweeper,
Wordle, Sudoku, TowerofHanoi, Sokoban, ...), reasoning tasks (``rg:`` reasoning-gym generators,
``logic:`` RuleTaker) and dataset tasks (``math:``, ``code:``, ``qa:``) behind one gymnasium-shaped
interface: ``gem.make(env_id)``, ``reset(seed) -> (obs, info)``, ``step(text) -> (obs, reward,
terminated, truncated, info)``. The environment parses the answer from the model's text itself
(``\\boxed{...}`` in the games), so the action is the assistant's text.

This module hands a GEM environment to trajtune's gym adapter (``GymTextEnv``, text actions) and
adds what GEM leaves to its own wrappers:

- each observation is followed by GEM's ``info["suffix"]`` (``Enter your next guess.``), which
  its wrappers append as the instruction for the next turn;
- GEM ends a game that ran out of turns with ``terminated`` and ``truncated`` both true, and a
  partial reward (GuessTheNumber: closeness of the last guess). trajtune counts that as
  ``max_turns`` and not as a success; success is a step that terminates the game (not truncated)
  with GEM's success reward (1.0);
- an invalid answer (no ``\\boxed{}``) is GEM's rule: a penalty (-0.1) and, in most games, the end
  of the episode, recorded as ``info["invalid_action"]``;
- GEM seeds Python's global ``random`` (and numpy's) at ``reset``; resets are serialised by a lock
  so that parallel episodes draw their games from their own seeds;
- dataset tasks (``math:``, ``code:``, ``qa:``) download their data from the Hugging Face hub when
  made; offline that is one ``EnvError`` naming the id, never a traceback mid-rollout;
- a scripted expert for the GuessTheNumber games (binary search on the hints), so SFT data can be
  generated.

gem-llm 0.1.0 pins reasoning-gym 0.1.23, while trajtune's ``reasoning_gym`` plug-in is tested
with 0.1.25; GEM's games do not use reasoning-gym, so the package is installed without its
dependencies (``INSTALL_HINT``).
"""

from __future__ import annotations

import difflib
import re
import threading
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trajtune.envs.adapters.gym_text import GymTextEnv
from trajtune.envs.base import ResetResult, StepResult, Task, parse_env_options
from trajtune.envs.toolenv import check_game_task, game_tasks
from trajtune.errors import EnvError
from trajtune.plugins import missing_nltk_resource, require
from trajtune.schema import Message, Trajectory

INSTALL_HINT = ("pip install --no-deps gem-llm==0.1.0 && pip install nltk==3.9.1 msgspec==0.19.0 "
                "'math-verify[antlr4_13_2]>=0.9,<0.10'  (gem-llm pins an older reasoning-gym, which its games do "
                "not use)")

INSTRUCTIONS = ("You are playing a game. Read the rules, think briefly, and write your answer each turn inside "
                "\\boxed{...} as the game asks.")

#: GEM's reward for a solved task (``LanguageGameReward.success_reward``).
SUCCESS_REWARD = 1.0

_RESET_LOCK = threading.Lock()


class GemNotInstalledError(EnvError, ImportError):
    """The optional ``gem-llm`` package is missing."""


class GemOptions(BaseModel):
    """Options of the ``gem`` environment."""

    model_config = ConfigDict(extra="forbid")

    env_id: str = Field("game:GuessTheNumber-v0-easy", description="a GEM environment id (games such as "
                        "game:GuessTheNumber-v0-easy, game:Mastermind-v0-easy, game:Minesweeper-v0-easy; rg:... "
                        "reasoning tasks; math:/code:/qa: ids download data and need network)")
    max_turns: int = Field(30, ge=1, le=1000, description="agent turns before the episode is cut (max_turns); the "
                           "game's own turn limit applies too")
    instructions: bool = Field(True, description="open with a short system instruction (false: GEM's own text "
                               "only)")


def _gem() -> Any:
    return require("gem", GemNotInstalledError, "the gem environment", INSTALL_HINT)


def registered_ids() -> list[str]:
    from gem.envs.registration import ENV_REGISTRY

    return sorted(ENV_REGISTRY)


class GemTask:
    """One GEM environment in the gym adapter's shape (see the module docstring)."""

    def __init__(self, env_id: str) -> None:
        gem = _gem()
        known = registered_ids()
        if env_id not in known:
            close = difflib.get_close_matches(env_id, known, n=6, cutoff=0.6)
            raise EnvError(f"gem environment {env_id!r} is not registered"
                           + (f"; did you mean {', '.join(close[:6])}?" if close else
                              f"; known ids start with {', '.join(sorted({k.split(':')[0] + ':' for k in known}))}"))
        try:
            self.env = gem.make(env_id)
        except Exception as e:  # noqa: BLE001 - dataset ids fetch from the hub when made; offline that fails
            nltk = missing_nltk_resource(e)
            if nltk is not None:  # NLTK's many-line banner as one line, with the download that fixes it
                raise EnvError(f"gem environment {env_id!r} needs the NLTK resource {nltk!r}, not found "
                               f"offline: python -m nltk.downloader {nltk} (once, with network)") from None
            why = (("a package gem-llm's install left out (its optional dependencies): install the module named "
                    "in the error") if isinstance(e, ImportError) else
                   "dataset ids (math:, code:, qa:) download their data from the hub and need network once")
            raise EnvError(f"gem environment {env_id!r} could not be made ({type(e).__name__}: "
                           f"{str(e).strip()[:200]}); {why}") from None
        self.env_id = env_id

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        with _RESET_LOCK:  # GEM seeds the global random module: one reset at a time
            obs, _ = self.env.reset(seed=seed)
        return str(obs), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        reward = float(reward)
        cut = bool(truncated)  # out of turns: GEM also sets terminated, with a partial reward
        ended = bool(terminated) and not cut
        out = {"success": ended and reward >= SUCCESS_REWARD, "gem_reward": reward,
               "invalid_action": reward < 0}
        suffix = (info or {}).get("suffix")
        text = str(obs) if not suffix or cut or ended else f"{obs}\n{suffix}"
        return text, reward, ended, cut, out


class GemEnv(GymTextEnv):
    """A GEM environment through the gym adapter (see the module docstring)."""

    description = ("GEM's games and reasoning tasks (GuessTheNumber, Mastermind, Minesweeper, Sudoku, "
                   "TowerofHanoi, ...): answer in \\boxed{...} as the game asks; options env_id, max_turns "
                   "(extra: gem).")
    options_model = GemOptions
    install = INSTALL_HINT

    def __init__(self, **options: Any) -> None:
        self.options = o = parse_env_options(GemOptions, "gem", options)
        # the adapter makes the game now: an unknown or offline-unavailable id fails here, not mid-rollout
        super().__init__(lambda: GemTask(o.env_id), name="gem", instructions=INSTRUCTIONS if o.instructions else "",
                         max_turns=o.max_turns)
        self.description = type(self).description

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return game_tasks("gem", split, n, seed, "env_id", self.options.env_id)

    def reset(self, task: Task) -> ResetResult:
        check_game_task(task, "env_id", self.options.env_id)
        return super().reset(task)

    def step(self, action: Message) -> StepResult:
        if action.tool_calls:  # no tools are offered: the answer is the text
            return StepResult([Message(role="user", content="Write your answer as text inside \\boxed{...}; "
                                       "there are no tools.", origin="environment")], info={"invalid_action": True})
        out = super().step(action)
        out.info = {**out.info, **{k: v for k, v in self.info.items() if k in ("success", "invalid_action")}}
        return out

    def success(self) -> bool:
        return bool(self.info.get("success"))

    def expert(self, task: Task) -> Trajectory:
        """Binary search on the higher/lower hints (the GuessTheNumber games)."""
        if "GuessTheNumber" not in self.options.env_id:
            raise NotImplementedError(f"gem environment {self.options.env_id!r} has no scripted expert "
                                      "(the GuessTheNumber games have one)")
        from trajtune.envs.runner import run_episode

        def policy(messages: list[Message], tools: list[Any]) -> Message:
            lo, hi = guess_range(messages)
            return Message(role="assistant", content=f"\\boxed{{{(lo + hi) // 2}}}")

        traj = run_episode(self, task, policy)
        traj.metadata.update({"expert": True, "policy": f"expert:{self.name}", "env_id": self.options.env_id})
        return traj


def guess_range(messages: list[Message]) -> tuple[int, int]:
    """The range the hidden number can still be in: the rules' ("between 1 and 10") narrowed by each
    hint ("the target number is lower than 5")."""
    first = next(m.text() for m in messages if m.role == "user")
    m = re.search(r"between (\d+) and (\d+)", first)
    if m is None:
        raise EnvError("GuessTheNumber expert: the rules do not say the range ('between A and B')")
    lo, hi = int(m.group(1)), int(m.group(2))
    for obs in (m.text() for m in messages if m.role == "user"):
        for guess, way in re.findall(r"you guessed (\d+), and the target number is (higher|lower)", obs):
            if way == "higher":
                lo = max(lo, int(guess) + 1)
            else:
                hi = min(hi, int(guess) - 1)
    return lo, hi
