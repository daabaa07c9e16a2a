"""Verifiers for best-of-N: score N candidate episodes of one task and pick one.

A verifier sees only the finished candidates (IR trajectories). Whether it uses information a
deployed agent would not have is part of its identity (``privileged``) and is printed next to
every number it produces, so an oracle upper bound is never mistaken for a method:

- ``env`` (privileged): the environment's own success check, ties broken by reward. This is the
  *oracle upper bound* of selection: it equals pass@N.
- ``reward`` (privileged): the environment's scalar return (``Trajectory.reward``). Differs from
  ``env`` on environments with partial credit (e.g. TextWorld's score); still uses the
  environment, so it is labelled privileged too.
- ``majority`` (not privileged): self-consistency. The answer shared by most candidates (final
  text answer, else the set of tool calls; see ``metrics.answer_key``); candidates without an
  answer get no votes.
- ``first`` (not privileged): always sample 0, the no-selection baseline.

Register more with ``@register_verifier("name")`` on a zero-argument factory, or pass
``package.module:factory`` on the command line. Ties go to the lowest sample index, so a
selection is deterministic.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from trajtune.errors import UsageError
from trajtune.eval.metrics import answer_key, category_of, eval_meta, pass_at_k, task_key
from trajtune.schema import Trajectory


@runtime_checkable
class Verifier(Protocol):
    name: str
    privileged: bool
    description: str

    def scores(self, candidates: Sequence[Trajectory]) -> list[float]:
        """One score per candidate (higher is better)."""
        ...


_REGISTRY: dict[str, Callable[[], Verifier]] = {}


def register_verifier(name: str) -> Callable[[Callable[[], Verifier]], Callable[[], Verifier]]:
    def deco(factory: Callable[[], Verifier]) -> Callable[[], Verifier]:
        _REGISTRY[name] = factory
        return factory

    return deco


def list_verifiers() -> list[str]:
    return sorted(_REGISTRY)


def get_verifier(name: str) -> Verifier:
    """A registered verifier by name, or ``package.module:factory`` (user code, imported)."""
    if name in _REGISTRY:
        return _REGISTRY[name]()
    if ":" in name:
        mod, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            raise UsageError(f"cannot load verifier {name!r}: {e}") from None
        v = factory()
        if not isinstance(v, Verifier):
            raise UsageError(f"verifier {name!r} must have name, privileged, description and scores(candidates)")
        return v
    raise UsageError(f"unknown verifier {name!r}; known: {', '.join(list_verifiers())} (or package.module:factory)")


def select(verifier: Verifier, candidates: Sequence[Trajectory]) -> int:
    """Index of the best candidate (first among equals)."""
    if not candidates:
        raise ValueError("best-of-N selection needs at least one candidate")
    s = verifier.scores(candidates)
    if len(s) != len(candidates):
        raise ValueError(f"verifier {verifier.name!r} returned {len(s)} scores for {len(candidates)} candidates")
    best = max(s)
    return next(i for i, x in enumerate(s) if x == best)


@dataclass
class _Simple:
    name: str
    privileged: bool
    description: str
    fn: Callable[[Sequence[Trajectory]], list[float]]

    def scores(self, candidates: Sequence[Trajectory]) -> list[float]:
        return self.fn(candidates)


def _success(t: Trajectory) -> bool:
    return bool(t.outcome and t.outcome.success)


@register_verifier("env")
def env_oracle() -> Verifier:
    return _Simple("env", True, "ORACLE upper bound: the environment's success check (equals pass@N)",
                   lambda cs: [float(_success(t)) + 1e-9 * float(t.reward or 0.0) for t in cs])


@register_verifier("reward")
def reward_verifier() -> Verifier:
    return _Simple("reward", True, "privileged: the environment's return (Trajectory.reward)",
                   lambda cs: [float(t.reward or 0.0) for t in cs])


def _majority(cs: Sequence[Trajectory]) -> list[float]:
    keys = [answer_key(t) for t in cs]
    votes = Counter(k for k in keys if k is not None)
    return [float(votes[k]) if k is not None else 0.0 for k in keys]


@register_verifier("majority")
def majority_verifier() -> Verifier:
    return _Simple("majority", False, "self-consistency: the most common final answer / tool-call set", _majority)


@register_verifier("first")
def first_verifier() -> Verifier:
    return _Simple("first", False, "baseline: always the first sample", lambda cs: [0.0] * len(cs))


def best_of_report(episodes: Sequence[Trajectory], verifier: Verifier, n: int) -> dict[str, Any]:
    """Selected-candidate metrics next to pass@N (the oracle bound any verifier can reach)."""
    from collections import defaultdict

    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in episodes:
        groups[task_key(t)].append(t)
    chosen: dict[str, Trajectory] = {}
    for task, cands in groups.items():
        cands.sort(key=lambda t: int(eval_meta(t).get("sample", 0)))
        chosen[task] = cands[select(verifier, cands)]

    def block(tasks: list[str]) -> dict[str, Any]:
        sel = [chosen[t] for t in tasks]
        k = min(n, *(len(groups[t]) for t in tasks))
        return {
            "tasks": len(tasks),
            "selected_success": sum(_success(t) for t in sel) / len(sel),
            "selected_mean_reward": sum(float(t.reward or 0.0) for t in sel) / len(sel),
            f"pass@{k}": sum(pass_at_k(len(groups[t]), sum(_success(c) for c in groups[t]), k) for t in tasks)
            / len(tasks),
        }

    tasks = list(groups)
    out: dict[str, Any] = {"n": n, "verifier": verifier.name, "privileged": verifier.privileged,
                           "label": ("privileged: uses the environment, an upper bound rather than a deployable method"
                                     if verifier.privileged else "deployable: no privileged information"),
                           "description": verifier.description, **block(tasks)}
    cats: dict[str, list[str]] = defaultdict(list)
    for t in tasks:
        c = category_of(groups[t][0])
        if c is not None:
            cats[c].append(t)
    if cats:
        out["categories"] = {c: block(ts) for c, ts in sorted(cats.items())}
    out["selected"] = {t: int(eval_meta(chosen[t]).get("sample", 0)) for t in tasks}
    return out
