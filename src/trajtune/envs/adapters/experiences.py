"""Lessons from experience in the prompt (training-free GRPO, ``algorithm: tfgrpo``).

Why a wrapper: a tfgrpo run changes no weight; what it learns is a short library of natural-language
lessons, and the frozen model only benefits when they are in its prompt. The same function puts them
there during the run's rollouts and at ``trajtune eval --experiences PATH``, so the model is evaluated
on exactly the prompt it was tuned with.

The lessons go at the end of the system message as a numbered list under ``LESSONS_HEADER`` (a system
message is added when the environment has none); an empty library leaves the prompt unchanged.
``env: {name: with_experiences, kwargs: {env: home, path: runs/tfgrpo-home}}`` wraps any environment
in a config (the registered factory is in ``trajtune.envs.registry``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from trajtune.envs.adapters.prompt_wrapper import PromptWrapper
from trajtune.envs.base import Environment
from trajtune.errors import DataError, require_input
from trajtune.schema import Message

LESSONS_HEADER = "Lessons from experience (apply them when they fit the task):"

#: The library file a tfgrpo run writes (and ``--experiences RUN_DIR`` reads).
EXPERIENCES_FILE = "experiences.json"


def lessons_block(lessons: Sequence[str]) -> str:
    return LESSONS_HEADER + "\n" + "\n".join(f"{i}. {text}" for i, text in enumerate(lessons, 1))


def inject_lessons(messages: list[Message], lessons: Sequence[str]) -> list[Message]:
    """The messages with the lessons appended to the system message (one is put first if there is none)."""
    if not lessons:
        return list(messages)
    out = [m.model_copy(deep=True) for m in messages]
    block = lessons_block(lessons)
    system = next((m for m in out if m.role == "system"), None)
    if system is None:
        return [Message(role="system", content=block), *out]
    text = system.text() or ""
    system.content = f"{text}\n\n{block}" if text else block
    return out


def load_experiences(path: str | Path, option: str = "--experiences") -> list[str]:
    """The lessons of a tfgrpo run directory, its ``experiences.json``, or a JSON list of strings."""
    p = require_input(path, option)
    if p.is_dir():
        p = require_input(p / EXPERIENCES_FILE, option)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{option} {p}: not valid JSON ({e}); give a tfgrpo run directory or its "
                        f"{EXPERIENCES_FILE}") from None
    lib = data.get("experiences") if isinstance(data, dict) else data
    if isinstance(lib, dict):
        lib = list(lib.values())
    if not isinstance(lib, list) or not all(isinstance(x, str) for x in lib):
        raise DataError(f"{option} {p}: expected {{\"experiences\": {{\"G0\": \"...\", ...}}}} (a tfgrpo run's "
                        f"{EXPERIENCES_FILE}) or a JSON list of strings")
    return list(lib)


class WithExperiences(PromptWrapper):
    """Any environment whose prompt carries a fixed list of lessons."""

    def __init__(self, inner: Environment, lessons: Sequence[str]):
        super().__init__(inner)
        self.lessons = list(lessons)

    def rewrite(self, messages: list[Message]) -> list[Message]:
        return inject_lessons(messages, self.lessons)
