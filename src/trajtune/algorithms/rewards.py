"""Reward composition with a per-stage schedule (``rl.reward``; Planner-R1 style shaping).

Why: a sparse pass/fail reward gives a small model nothing to climb. Planner-R1 shapes it from
named terms (schema validity, fraction of constraints met, all met, final pass) whose weights change
by stage: dense partial credit first, the strict outcome later. Here the reward of an episode is

    R = Σ_c λ_c(step) · r_c

over named terms, with the weights λ of the stage the step is in. Terms:

- built in: ``env`` (the environment's return, the default reward), ``success`` (1 if the
  environment says the task was solved), ``format`` (1 if every assistant turn parsed), ``length``
  (policy tokens), ``turns`` (assistant turns);
- ``info.NAME``: a term the environment reports in a step's ``info["reward_terms"]`` (summed over
  the episode's steps; an environment that never reports it is an error, not a silent 0);
- ``module:function``: a plug-in called with the episode's IR ``Trajectory``, returning a number.

Each term's batch mean is logged as ``reward/NAME`` every step (the raw value, before weighting),
the stage as ``reward_stage``; each episode records its values in ``metadata.reward_terms``.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

from pydantic import Field, field_validator, model_validator

from trajtune.config import _C
from trajtune.errors import ConfigError
from trajtune.progress import console

BUILTIN = ("env", "success", "format", "length", "turns")


def _check_name(name: str) -> str:
    if name in BUILTIN or (name.startswith("info.") and len(name) > 5):
        return name
    if ":" in name:
        module, _, attr = name.partition(":")
        if module and attr:
            return name
    raise ValueError(f"unknown reward term {name!r}: use one of {', '.join(BUILTIN)}, info.NAME (reported by the "
                     "environment in info['reward_terms']) or module:function (a plug-in)")


class RewardStage(_C):
    from_step: int = Field(gt=0, description="the first step (0-based) of this stage")
    terms: dict[str, float] = Field(description="the weights from that step on (a term left out weighs 0)")

    @field_validator("terms")
    @classmethod
    def _names(cls, v: dict[str, float]) -> dict[str, float]:
        for k in v:
            _check_name(k)
        return v


class RewardSpec(_C):
    """``rl.reward``: R = Σ λ_c · r_c over named terms, with optional stages."""

    terms: dict[str, float] = Field(description="weight per term from step 0: env, success, format, length, turns, "
                                                "info.NAME (from the environment) or module:function (a plug-in)")
    stages: list[RewardStage] = Field(default_factory=list, description="later stages: from_step and the weights "
                                                                        "that replace the earlier ones")

    @field_validator("terms")
    @classmethod
    def _names(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("rl.reward.terms is empty: name at least one term")
        for k in v:
            _check_name(k)
        return v

    @model_validator(mode="after")
    def _ordered(self) -> "RewardSpec":
        steps = [s.from_step for s in self.stages]
        if steps != sorted(set(steps)):
            raise ValueError(f"rl.reward.stages must have strictly increasing from_step: {steps}")
        return self

    def names(self) -> list[str]:
        seen: dict[str, None] = dict.fromkeys(self.terms)
        for s in self.stages:
            seen.update(dict.fromkeys(s.terms))
        return list(seen)

    def stage_at(self, step: int) -> int:
        return sum(1 for s in self.stages if s.from_step <= step)

    def weights_at(self, step: int) -> dict[str, float]:
        k = self.stage_at(step)
        return dict(self.terms if k == 0 else self.stages[k - 1].terms)


def resolve_plugin(name: str) -> Callable[[Any], float]:
    module, _, attr = name.partition(":")
    try:
        obj: Any = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - the user's module: name it and what went wrong
        raise ConfigError(f"rl.reward term {name!r}: cannot import module {module!r} ({type(e).__name__}: {e})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"rl.reward term {name!r}: module {module!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"rl.reward term {name!r}: {attr!r} is not callable")
    return obj  # type: ignore[no-any-return]


class RewardComposer:
    """Sets each episode's training reward from the terms (called by ``RolloutSource`` per round)."""

    def __init__(self, spec: RewardSpec):
        self.spec = spec
        self.plugins = {n: resolve_plugin(n) for n in spec.names() if ":" in n}
        self.errors = 0  # plug-in calls that raised, since the last batch
        self.warned: set[str] = set()

    def values(self, episode: Any) -> dict[str, float]:
        traj, tt = episode.trajectory, episode.tokens
        reported = traj.metadata.get("reward_info") or {}
        out: dict[str, float] = {}
        for name in self.spec.names():
            if name == "env":
                v = float(traj.reward or 0.0)
            elif name == "success":
                v = float(bool(traj.outcome and traj.outcome.success))
            elif name == "format":
                v = float(episode.format_errors == 0)
            elif name == "length":
                v = float(tt.n_policy())
            elif name == "turns":
                v = float(episode.turns)
            elif name.startswith("info."):
                v = float(reported.get(name[5:], 0.0))  # an episode that never stepped reports nothing
            else:
                v = self._plugin(name, traj)
            out[name] = v
        return out

    def _plugin(self, name: str, traj: Any) -> float:
        """A plug-in term that raises or returns no number does not stop the run: like an environment
        error, the episode gets a NaN reward (masked downstream), it is counted in ``reward/errors``
        and the first failure of each term is shown with its exception."""
        try:
            return float(self.plugins[name](traj))
        except Exception as e:  # noqa: BLE001 - the user's code: report it, keep training
            self.errors += 1
            if name not in self.warned:
                self.warned.add(name)

                console.print(f"[yellow]warning:[/yellow] reward term {name!r} raised {type(e).__name__}: {e} "
                              f"(episode {getattr(traj, 'id', '?')}); its episodes get no reward and are counted in "
                              "reward/errors", highlight=False, soft_wrap=True)
            return float("nan")

    def _check_reported(self, episodes: list[Any]) -> None:
        """An ``info.NAME`` term no episode reported, in a batch where the environment did step to the
        end of an episode, is a misnamed term or an environment that does not report it: an error."""
        finished = [e for e in episodes if e.trajectory.outcome and e.trajectory.outcome.termination == "done"]
        if not finished:
            return
        seen: set[str] = set()
        for e in episodes:
            seen |= set(e.trajectory.metadata.get("reward_info") or {})
        for name in self.spec.names():
            if name.startswith("info.") and name[5:] not in seen:
                env = finished[0].trajectory.metadata.get("env", "the environment")
                raise ConfigError(f"rl.reward term {name!r}: {env} did not report {name[5:]!r} in any step's "
                                  f"info['reward_terms'] (it reported: {sorted(seen) or 'nothing'})")

    def __call__(self, step: int, episodes: list[Any]) -> dict[str, float]:
        self._check_reported(episodes)
        weights = self.spec.weights_at(step)
        sums: dict[str, float] = {n: 0.0 for n in self.spec.names()}
        for e in episodes:
            vals = self.values(e)
            total = sum(weights.get(n, 0.0) * v for n, v in vals.items())
            e.tokens.reward = total if math.isfinite(total) else float("nan")  # non-finite: masked downstream
            e.trajectory.metadata["reward_terms"] = vals
            e.trajectory.metadata["shaped_reward"] = total
            for n, v in vals.items():
                sums[n] += v
        n = max(1, len(episodes))
        errors, self.errors = self.errors, 0
        means = {f"reward/{k}": v / n for k, v in sums.items()}
        if self.plugins:  # a failed plug-in leaves NaN in its sum: report the mean over the episodes that scored
            for k in self.plugins:
                got = [e.trajectory.metadata["reward_terms"][k] for e in episodes]
                ok = [v for v in got if math.isfinite(v)]
                means[f"reward/{k}"] = sum(ok) / len(ok) if ok else float("nan")
            means["reward/errors"] = float(errors)
        return {**means, "reward_stage": float(self.spec.stage_at(step))}
