"""The algorithm registry: a training algorithm is one module that registers itself here.

A module defines its run config (a ``RunBase`` subclass whose ``algorithm`` field is a
``Literal`` of its name: one member of the union tagged by ``algorithm:``) and an ``Algorithm``
with two functions:

- ``prepare(cfg, ctx)``: everything that can fail on the user's input before anything is written
  or a model is loaded (read and validate data, check environments); returns whatever ``build``
  needs.
- ``build(cfg, ctx, prepared)``: after the run directory exists and the policy is loaded, the
  ``Recipe``: an experience source (with its transform list), an objective, and how the learner
  should use them.

An algorithm whose saved model needs more than base + adapter to run (DualTune's argument adapters
and two-stage decoding) declares a ``load_hook``; ``load_trained`` runs the hooks, so model loading
itself (``models.loading``) never names an algorithm.

``trajtune.train.run`` does the rest for every algorithm: run-directory checks, resume, the
learner, the final model, ``result.json``. docs/algorithms.md walks through adding one (DPO).

Loading a run config (``load_run_config``) lives here too: it dispatches on the ``algorithm:`` tag
to the registered config classes, so ``trajtune.config`` (the shared sections, below every
algorithm) never imports the registry.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajtune.config import read_config, validate_config, with_overrides
from trajtune.errors import ConfigError
from trajtune.models.loading import load_model
from trajtune.models.resolve import resolve_model

#: Modules that register the built-in algorithms (imported on first use: each imports the registry
#: to register itself, so the registry cannot import them at its top).
BUILTIN_MODULES = ("trajtune.algorithms.sft", "trajtune.algorithms.rl", "trajtune.algorithms.rft",
                   "trajtune.algorithms.dpo", "trajtune.algorithms.tfgrpo",
                   "trajtune.algorithms.dualtune")


@dataclass
class RunContext:
    """What ``prepare`` and ``build`` may use. ``out``, ``model`` and ``load_reference`` are set
    before ``build``; ``prepare`` sees only the tokenizer and the renderer."""

    tokenizer: Any
    renderer: Any
    quiet: bool = False
    out: Path | None = None
    model: Any = None
    load_reference: Callable[[], Any] | None = None  # a frozen copy of the initial policy


@dataclass
class Recipe:
    """How the one learner trains this algorithm."""

    source: Any  # an ExperienceSource: batch(step, model) -> (trajectories, metrics)
    objective: Any  # an Objective (algorithms.base)
    micro_batch_size: int
    epochs: int = 1  # passes over one step's experience
    mini_batches: int = 1  # optimizer updates per pass
    step_logs: list[Path] = field(default_factory=list)  # JSONL files with a "step" per line (trimmed on resume)
    result: dict[str, Any] = field(default_factory=dict)  # extra fields for result.json
    shown: tuple[str, ...] = ("loss",)  # metrics on the progress bar
    plot: tuple[str, tuple[str, ...], str] | None = None  # (file name, metrics, title)
    on_resume: Callable[[int], None] | None = None  # told the step a run resumes from
    on_weights: Callable[[int, Any], None] | None = None  # told (step, model) after each step's updates
    on_final: Callable[[Path], None] | None = None  # told the final directory once it is saved (rank 0)


@dataclass
class Algorithm:
    name: str
    config: type  # the run config class (a trajtune.config.RunBase subclass)
    summary: str
    prepare: Callable[[Any, RunContext], Any]
    build: Callable[[Any, RunContext, Any], Recipe]
    #: (model, directory) -> model: completes a saved adapter directory loaded for inference (more
    #: adapters, a sampler the model carries); returns the model unchanged for a directory not its own
    load_hook: Callable[[Any, str], Any] | None = None


_ALGORITHMS: dict[str, Algorithm] = {}


def register_algorithm(algo: Algorithm) -> Algorithm:
    field_ = algo.config.model_fields.get("algorithm")
    if field_ is None or field_.default != algo.name:
        raise ValueError(f"{algo.config.__name__}.algorithm must default to {algo.name!r} (the union's tag)")
    if algo.name in _ALGORITHMS and _ALGORITHMS[algo.name] is not algo:
        raise ValueError(f"algorithm {algo.name!r} is already registered")
    _ALGORITHMS[algo.name] = algo
    return algo


def _load_builtins() -> None:
    for mod in BUILTIN_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:  # a module that exists but fails to import is a bug, not a missing plug-in
                raise


def algorithms() -> dict[str, Algorithm]:
    _load_builtins()
    return dict(_ALGORITHMS)


def get_algorithm(name: str) -> Algorithm:
    known = algorithms()
    if name not in known:
        raise ConfigError(f"unknown algorithm {name!r}; known: {', '.join(sorted(known))}")
    return known[name]


def load_run_config(path: str | Path | None, overrides: list[str] | None = None,
                    algorithm: str | None = None) -> Any:
    """A run config of any registered algorithm, chosen by its ``algorithm:`` key (the union's tag).
    ``algorithm`` is what the command implies (``trajtune sft`` → sft); a config naming another
    algorithm is refused rather than silently run as something else."""
    data, source = read_config(path, overrides)
    known = algorithms()
    tag = data.get("algorithm", algorithm)
    if tag is None:
        raise ConfigError(f"{source}: no `algorithm:` key; set one of: {', '.join(sorted(known))}")
    if algorithm is not None and tag != algorithm:
        raise ConfigError(f"{source}: algorithm: {tag} is not a {algorithm} config; run it with "
                          f"`trajtune train --config {source}`")
    if tag not in known:
        raise ConfigError(f"{source}: unknown algorithm {tag!r}; known: {', '.join(sorted(known))}")
    return validate_config({**data, "algorithm": tag}, known[tag].config, with_overrides(source, overrides))


def load_trained(name_or_path: str, *, dtype: str = "auto") -> Any:
    """A model for inference (not trainable), as ``models.loading.load_model`` loads it, completed by
    every registered algorithm's ``load_hook`` when it is a saved adapter directory: a DualTune
    run's final directory comes back with its argument adapters and decodes in two stages."""
    model = load_model(name_or_path, dtype=dtype, trainable=False)
    src = resolve_model(name_or_path)
    if src.kind == "dir" and (Path(src.path) / "adapter_config.json").exists():
        for algo in algorithms().values():
            if algo.load_hook is not None:
                model = algo.load_hook(model, src.path)
    return model
