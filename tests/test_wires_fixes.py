"""Small promises the code and docs make, each checked where a user meets it: packaging extras that
install something the package imports, the documented exit code of `models prepare`, `config
show/init --help` naming every registered algorithm, the "Adding an algorithm" snippet of
docs/algorithms.md running and passing the description rule, and BayesLoRA refusing an adapter
whose LoRA dropout is 0."""

from __future__ import annotations

import re
import textwrap
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trajtune.algorithms.registry import algorithms
from trajtune.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_every_runtime_extra_installs_only_packages_the_package_imports():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    src = "\n".join(p.read_text() for p in (ROOT / "src").rglob("*.py"))
    unused = []
    for extra, reqs in extras.items():
        if extra in ("test", "bench"):  # for the test suite and the side-by-side benchmarks, not the package
            continue
        for req in reqs:
            name = re.match(r"[A-Za-z0-9_.-]+", req).group(0).replace("-", "_")
            # imported (import x / from x), or named as a string (the tracking backends' find_spec table)
            if not re.search(rf"^\s*(import|from) {name}\b|[\"']{name}[\"']", src, re.M):
                unused.append(f"{extra}: {req}")
    assert not unused, unused


def test_models_prepare_exits_with_the_model_load_code(tmp_path):
    from trajtune.errors import EXIT_CODES, ModelLoadError

    r = runner.invoke(app, ["models", "prepare", str(tmp_path / "missing.gguf")])
    assert ModelLoadError.exit_code == 4 and "ModelLoadError" in EXIT_CODES[4]
    assert r.exit_code == 4, r.output
    assert "error:" in r.output and "missing.gguf" in r.output


@pytest.mark.parametrize("command", ["show", "init"])
def test_config_help_names_every_registered_algorithm(command):
    r = runner.invoke(app, ["config", command, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    names = sorted(algorithms())
    assert len(names) >= 6
    missing = [n for n in names if not re.search(rf"\b{n}\b", r.output)]
    assert not missing, (missing, r.output)


def _snippets(doc: str, heading: str) -> list[str]:
    """The indented code blocks under ``heading`` (up to the next ``## ``), dedented."""
    section = doc.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    blocks, cur = [], []
    for line in section.splitlines():
        if line.startswith("       ") or (cur and not line.strip()):
            cur.append(line)
        elif cur:
            blocks.append(textwrap.dedent("\n".join(cur)).strip())
            cur = []
    if cur:
        blocks.append(textwrap.dedent("\n".join(cur)).strip())
    return [b for b in blocks if b]


def test_the_adding_an_algorithm_snippet_runs_registers_and_describes_every_field(monkeypatch):
    import trajtune.algorithms.registry as registry
    from test_config_discover import _models  # the description rule every run config passes

    blocks = _snippets((ROOT / "docs" / "algorithms.md").read_text(), "Adding an algorithm")
    config = next(b for b in blocks if "class DPORunConfig" in b)
    register = next(b for b in blocks if "register_algorithm(" in b)
    monkeypatch.setattr(registry, "_ALGORITHMS", {})  # a registry of its own: the real dpo stays registered
    ns: dict = {"_prepare": lambda cfg, ctx: None, "_build": lambda cfg, ctx, prepared: None}
    exec(compile(config, "docs/algorithms.md (run config)", "exec", dont_inherit=True), ns)
    exec(compile(register, "docs/algorithms.md (register)", "exec", dont_inherit=True), ns)
    algo = registry._ALGORITHMS["dpo"]
    assert algo.config is ns["DPORunConfig"]
    seen: set = set()
    _models(algo.config, seen)
    missing = [f"{m.__name__}.{n}" for m in seen for n, f in m.model_fields.items() if not f.description]
    assert not missing, missing  # the rule tests/test_config_discover.py applies to every run config
    cfg = algo.config.model_validate({"model": "m", "output_dir": "o", "dpo": {"beta": 0.2}})
    assert cfg.algorithm == "dpo" and cfg.dpo.beta == 0.2


def test_bayes_lora_refuses_an_adapter_trained_without_lora_dropout(tmp_path, tiny_dir):
    from model_fixtures import randomize_lora_b, save_adapter
    from trajtune.models.loading import LoraConfig, load_model

    model = load_model(str(tiny_dir), lora=LoraConfig(r=4, alpha=8))  # the default dropout: 0
    randomize_lora_b(model, seed=1)
    adapter = tmp_path / "adapter"
    assert save_adapter(model, tiny_dir, adapter)["lora_dropout"] == 0.0
    out = tmp_path / "eval"
    r = runner.invoke(app, ["eval", "--model", str(adapter), "--env", "home", "--tasks", "1", "--max-new-tokens", "4",
                            "--bayes-lora", "3", "--device", "cpu", "-q", "--out", str(out), "--no-report"])
    assert r.exit_code == 2, r.output
    assert "LoRA dropout > 0" in r.output and "mutual information would be 0" in r.output
    assert not (out / "results.json").exists()
