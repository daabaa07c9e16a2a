"""Eval suites: what ``trajtune eval --benchmark NAME`` runs, and the plug-in point for benchmarks.

Why a plug-in point: a benchmark brings its own tasks, its own scoring and its own report (BFCL
scores single-turn answers by its AST rules and reports per-category accuracy). If the harness
knew each of them, every new benchmark would add an import of it to a generic module. Instead a
benchmark is an ``EvalSuite`` registered under a name, and the harness only asks it for

- ``suites(settings)``: the ``Suite`` list to run: each one either an environment factory
  (multi-turn episodes through the backend's rollout; ``finish`` may record the benchmark's
  verdict per episode) or single-turn ``prompts`` with a ``score`` function that turns a
  reference prompt and the model's completion into the scored episode;
- ``report(episodes)``: an extra section of the results (``results[name]``), or None.

A suite is found by name in the ``register_eval_suite`` registry, then among the plug-ins
(``trajtune.plugins``: trajtune's own BFCL and TextWorld, and the ``trajtune.eval_suites``
entry-point group of installed packages). docs/envs.md ("Plug-ins") shows a complete one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from trajtune import plugins
from trajtune.envs.adapters.experiences import WithExperiences
from trajtune.envs.base import Environment, Task
from trajtune.envs.registry import make_env
from trajtune.errors import UsageError
from trajtune.schema import Trajectory

#: ``score(reference, completion, parser)``: the scored episode of one single-turn item; the
#: completion is None when the prompt alone filled the context (no answer at all).
Score = Callable[[Trajectory, "str | None", str], Trajectory]


@dataclass
class Suite:
    """One environment, or one group of single-turn prompts: tasks run and scored the same way."""

    name: str
    tasks: list[Task]
    category: str | None = None  # fixed category; else task.data["kind"]
    env_factory: Callable[[], Environment] | None = None  # multi-turn
    prompts: dict[str, Trajectory] | None = None  # single-turn: task id -> the reference prompt
    score: Score | None = None  # single-turn: how a completion is scored
    max_turns: int = 8
    finish: Callable[[Environment, Trajectory], None] | None = None

    def category_of(self, task: Task) -> str | None:
        if self.category is not None:
            return self.category
        kind = task.data.get("kind") if isinstance(task.data, dict) else None
        return None if kind is None else str(kind)


class SuiteSettings(Protocol):
    """What an eval suite may read of the evaluation's settings (``trajtune.eval.harness.EvalSettings``)."""

    categories: list[str] | None  # --categories (only for a suite with takes_categories)
    limit: int | None  # --limit: the first N entries of each category
    env_kwargs: dict[str, Any]  # --env-arg
    tasks: int  # --tasks
    split: str
    seed: int
    max_turns: int | None  # --max-turns (None: the environment's own)
    experiences: list[str] | None  # lessons for the prompt (--experiences)


class EvalSuite:
    """A benchmark as ``trajtune eval --benchmark NAME`` runs it. Subclasses set ``name`` and
    implement ``suites``; ``report`` adds a section to the results (default: none)."""

    name: str = "suite"
    #: Whether ``--categories`` selects among this benchmark's categories.
    takes_categories: bool = False

    def suites(self, settings: SuiteSettings) -> list[Suite]:
        raise NotImplementedError

    def report(self, episodes: Sequence[Trajectory]) -> dict[str, Any] | None:
        return None


class EnvEvalSuite(EvalSuite):
    """A benchmark that is one registered environment (``env``), run on its held-out tasks."""

    env: str = ""

    def suites(self, settings: SuiteSettings) -> list[Suite]:
        return [env_suite(self.env or self.name, settings.env_kwargs, settings)]


def env_suite(name: str, kwargs: dict[str, Any], s: SuiteSettings, **extra: Any) -> Suite:
    """The environment ``name`` (with ``kwargs``, and in-process ``extra`` arguments) as one suite:
    ``s.tasks`` tasks of ``s.split``, lessons in the prompt when ``s.experiences`` is set."""
    def factory() -> Environment:
        if s.experiences is not None:  # the prompt a tfgrpo run tuned its lessons with
            return WithExperiences(make_env(name, **kwargs, **extra), s.experiences)
        return make_env(name, **kwargs, **extra)

    probe = factory()
    return Suite(name=name, tasks=probe.tasks(s.split, s.tasks, seed=s.seed), env_factory=factory,
                 max_turns=s.max_turns or probe.max_turns)


_SUITES: dict[str, EvalSuite] = {}


def register_eval_suite(suite: EvalSuite) -> EvalSuite:
    """Make ``suite`` available as ``--benchmark suite.name`` (the one call a program needs)."""
    if suite.name in _SUITES and _SUITES[suite.name] is not suite:
        raise ValueError(f"eval suite {suite.name!r} is already registered")
    _SUITES[suite.name] = suite
    return suite


def eval_suite_names() -> list[str]:
    """Every benchmark name: registered ones and plug-ins (not imported to list them)."""
    return sorted(set(_SUITES) | set(plugins.references(plugins.EVAL_SUITES)))


def get_eval_suite(name: str) -> EvalSuite:
    """The benchmark ``name``; a plug-in is imported and registered on first use."""
    if name not in _SUITES:
        if name not in plugins.references(plugins.EVAL_SUITES):
            raise UsageError(f"unknown benchmark {name!r}; known: {', '.join(eval_suite_names())}")
        try:
            made = plugins.load(plugins.EVAL_SUITES, name)
        except (ImportError, AttributeError) as e:  # e.g. the plug-in's optional dependency is missing
            raise UsageError(f"benchmark {name!r} is a plug-in ({plugins.references(plugins.EVAL_SUITES)[name]}) "
                             f"that cannot be loaded: {type(e).__name__}: {e}") from None
        suite = made() if isinstance(made, type) else made
        if not isinstance(suite, EvalSuite) or suite.name != name:
            raise UsageError(f"the eval-suite plug-in {name!r} ({plugins.references(plugins.EVAL_SUITES)[name]}) "
                             f"is not an EvalSuite named {name!r}")
        register_eval_suite(suite)
    return _SUITES[name]
