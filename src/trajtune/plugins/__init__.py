"""Plug-ins: environments and eval suites that register from outside the generic layers.

BFCL (``bfcl/``), TextWorld (``textworld.py``), reasoning-gym (``reasoning_gym_env.py``), TextArena
(``textarena_env.py``), τ²-bench (``tau2/``), GEM (``gem_env.py``) and MiniWoB++
(``miniwob_env.py``) adapt other people's benchmarks to trajtune's IR.
They plug in exactly as a third party's package would, so ``trajtune.envs`` and ``trajtune.eval``
name no benchmark: each plug-in is a reference ``"module:attr"`` under a name in a group,

- ``trajtune.envs``: an ``Environment`` class or a function returning one (``make_env(name)``);
- ``trajtune.eval_suites``: an ``EvalSuite`` class (``trajtune.eval.suites``; ``--benchmark name``).

A third party declares them as entry points in its ``pyproject.toml``::

    [project.entry-points."trajtune.envs"]
    my_world = "my_pkg.world:MyWorld"

    [project.entry-points."trajtune.eval_suites"]
    my_bench = "my_pkg.bench:MyBench"

trajtune's own are listed in ``BUILTIN`` below rather than in trajtune's ``pyproject.toml``: entry
points exist only once ``pip install`` has written the package's metadata, and a source checkout
on ``PYTHONPATH`` (or an editable install made before an entry was added) would silently lose
them. Why "plugins" and not "benchmarks": the top-level ``benchmarks/`` directory holds the
project's speed and experiment scripts, and "suite" already means one group of eval tasks
(``trajtune.eval.suites.Suite``, ``--suite safety``).

This module imports nothing of trajtune: the registries read it, and a plug-in's own module is
imported only when its name is first used (its optional dependency may be missing).
"""

from __future__ import annotations

import importlib
import re
from importlib import metadata
from typing import Any

ENVS = "trajtune.envs"
EVAL_SUITES = "trajtune.eval_suites"

#: trajtune's own plug-ins: group -> name -> "module:attr" (the format of an entry point's value).
BUILTIN: dict[str, dict[str, str]] = {
    ENVS: {
        "bfcl_multi_turn": "trajtune.plugins.bfcl.multi_turn:BFCLMultiTurnEnv",
        "bfcl_single_turn": "trajtune.plugins.bfcl.single_turn:BFCLSingleTurnEnv",
        "textworld": "trajtune.plugins.textworld:TextWorldEnv",
        "reasoning_gym": "trajtune.plugins.reasoning_gym_env:ReasoningGymEnv",
        "textarena": "trajtune.plugins.textarena_env:TextArenaEnv",
        "tau2": "trajtune.plugins.tau2:Tau2Env",
        "gem": "trajtune.plugins.gem_env:GemEnv",
        "miniwob": "trajtune.plugins.miniwob_env:MiniWoBEnv",
    },
    EVAL_SUITES: {
        "bfcl": "trajtune.plugins.bfcl.suite:BFCLSuite",
        "textworld": "trajtune.plugins.textworld:TextWorldSuite",
        "tau2": "trajtune.plugins.tau2.suite:Tau2Suite",
    },
}


def missing_nltk_resource(e: BaseException) -> str | None:
    """The NLTK resource a game could not find offline (``words`` from NLTK's many-line, coloured
    "Resource words not found" banner), or None when ``e`` is not that error."""
    if not isinstance(e, LookupError):
        return None
    plain = re.sub(r"\x1b\[[0-9;]*m", "", str(e))  # NLTK colours the resource's name on a terminal
    m = re.search(r"Resource '?([\w/.-]+)'? not found", plain)
    return m.group(1) if m else None


def require(module: str, error: type[Exception], what: str, install: str) -> Any:
    """Import a plug-in's optional dependency, or raise ``error`` saying what needs it and how to
    install it (instead of a bare ``ModuleNotFoundError`` deep in a rollout)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise error(f"{what} needs the {module} package ({e}). Install it with: {install}") from None


def references(group: str) -> dict[str, str]:
    """Every plug-in of ``group``: installed packages' entry points, then trajtune's own (which win a
    name both declare, so an installed package cannot silently replace a built-in)."""
    found = {ep.name: ep.value for ep in metadata.entry_points(group=group)}
    return {**found, **BUILTIN.get(group, {})}


def load(group: str, name: str) -> Any:
    """Import the plug-in ``name`` of ``group`` and return the object its reference names.

    ``ImportError`` (an optional dependency missing) and ``AttributeError`` (a reference to nothing)
    propagate: the registries turn them into a user error naming the plug-in."""
    ref = references(group)[name]
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj
