"""Each setting is declared once: in the runtime dataclass (trajtune.settings.setting), and the config
sections are built from it (config.runtime_section). These tests fail if a setting is declared a
second time, by hand, on the config side, or if the two sides disagree."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from pathlib import Path

import pytest
from pydantic import Field

import trajtune
from trajtune import config
from trajtune.chat.render import RenderConfig
from trajtune.config import DataSpec, RenderSpec, RolloutSpec, TrainSpec, runtime_field, runtime_section
from trajtune.learner import LearnerConfig
from trajtune.rollout import RolloutConfig
from trajtune.settings import is_setting, setting

#: Every config section with a runtime counterpart, and that counterpart.
PAIRS = [(RolloutSpec, RolloutConfig), (RenderSpec, RenderConfig), (TrainSpec, LearnerConfig),
         (DataSpec, RenderConfig)]


def _dc_default(f: dataclasses.Field) -> object:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


@pytest.mark.parametrize("spec, runtime", PAIRS, ids=lambda c: c.__name__)
def test_same_named_fields_are_derived_and_equal(spec, runtime):
    dc = {f.name: f for f in dataclasses.fields(runtime)}
    hints = typing.get_type_hints(runtime)
    shared = [n for n in spec.model_fields if n in dc]
    assert shared and spec.runtime is runtime
    assert set(shared) == set(spec.runtime_fields)  # every same-named key is taken from the dataclass
    for n in shared:
        got, want = spec.model_fields[n], runtime_field(runtime, n)[1]
        assert got.get_default(call_default_factory=True) == _dc_default(dc[n]), n
        assert got.annotation == hints[n], n
        assert got.description == dc[n].metadata["description"] and got.description, n
        assert got.metadata == want.metadata, n  # the bounds
    # and no class of the section's (its validators and methods) declares one of them again
    for cls in spec.__mro__:
        if cls.__module__ == config.__name__ and not cls.__name__.endswith("Fields"):
            assert not set(vars(cls).get("__annotations__", {})) & set(dc), cls


def test_every_setting_is_one_config_key():
    """A runtime field declared with ``setting`` is a key of exactly one section; a new one cannot be
    forgotten on the config side."""
    for runtime in {r for _, r in PAIRS}:
        for f in dataclasses.fields(runtime):
            owners = [s.__name__ for s, r in PAIRS if r is runtime and f.name in s.runtime_fields]
            assert len(owners) == (1 if is_setting(f) else 0), (runtime.__name__, f.name, owners)


def test_config_module_declares_no_runtime_field_by_hand():
    """Reading config.py's source: neither a section's class body nor a ``(name, type, Field)`` entry
    of its layout carries the name of a field of its runtime dataclass."""
    runtime_of = {s.__name__: r for s, r in PAIRS}
    tree = ast.parse(inspect.getsource(config))
    by_hand = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name in runtime_of:
            by_hand += [(node.name, st.target.id) for st in node.body
                        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)]
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "runtime_section":
            section = node.args[0].value
            by_hand += [(section, e.elts[0].value) for e in node.args[2].elts if isinstance(e, ast.Tuple)]
    assert {x[0] for x in by_hand} >= {"TrainSpec", "RolloutSpec", "DataSpec"}  # the walk sees the layouts
    assert [(s, n) for s, n in by_hand if n in {f.name for f in dataclasses.fields(runtime_of[s])}] == []


def test_runtime_section_refuses_a_second_declaration():
    with pytest.raises(TypeError, match="do not declare it again"):
        runtime_section("X", LearnerConfig, ["steps", ("lr", float, Field(1e-3, description="again"))])
    with pytest.raises(TypeError, match="not a setting"):
        runtime_section("X", LearnerConfig, ["betas"])  # a learner-only field, not a config key


def test_lower_layers_do_not_import_the_config_layer():
    src = Path(trajtune.__file__).parent
    for rel in ("settings.py", "rollout.py", "learner.py", "chat"):
        for path in ([src / rel] if rel.endswith(".py") else sorted((src / rel).rglob("*.py"))):
            tree = ast.parse(path.read_text())
            mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
            mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            assert not {m for m in mods if m == "trajtune.config" or m.startswith("trajtune.config.")}, path


def test_the_configs_defaults_are_the_runtime_defaults():
    """What a run gets from an empty section is what the dataclass gives a direct caller."""
    assert RolloutSpec().to_config() == RolloutConfig()
    assert RenderSpec().to_render_config() == RenderConfig()
    t = TrainSpec()
    assert LearnerConfig(**t.runtime_kwargs()) == LearnerConfig()
    assert LearnerConfig().lr == t.lr == 1e-4  # the drift found (1e-3 here, 1e-4 in the config): the config's won


def test_setting_checks_its_bounds_names():
    with pytest.raises(TypeError, match="unknown bound"):
        setting(1, description="x", gte=0)
