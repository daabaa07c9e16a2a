"""Discoverable configs: descriptions everywhere, `config show/init`, "did you mean", help types."""

from __future__ import annotations

import typing

import pytest
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from trajtune.algorithms.registry import algorithms, load_run_config
from trajtune.cli.main import app
from trajtune.config import ConfigError
from trajtune.config_docs import field_docs

runner = CliRunner()
ALGOS = sorted(algorithms())


def _models(cls, seen):
    if cls in seen:
        return
    seen.add(cls)
    for f in cls.model_fields.values():
        for a in typing.get_args(f.annotation) or (f.annotation,):
            if isinstance(a, type) and issubclass(a, BaseModel):
                _models(a, seen)


def test_every_field_of_every_run_config_has_a_description():
    seen: set = set()
    for a in algorithms().values():
        _models(a.config, seen)
    missing = [f"{m.__name__}.{n}" for m in seen for n, f in m.model_fields.items() if not f.description]
    assert len(seen) >= 15 and not missing, missing


@pytest.mark.parametrize("algo", ALGOS)
def test_config_init_writes_a_file_that_validates_to_the_defaults(algo, tmp_path):
    path = tmp_path / f"{algo}.yaml"
    r = runner.invoke(app, ["config", "init", algo, "-o", str(path)])
    assert r.exit_code == 0, r.output
    text = path.read_text()
    cfg = load_run_config(path)
    assert cfg.algorithm == algo
    data = yaml.safe_load(text)
    # the file spells out every default: it equals the config built from the required keys alone
    minimal = {k: data[k] for k in ("algorithm", "model", "output_dir", "env", "data") if k in data}
    if "data" in minimal:
        minimal["data"] = {"path": minimal["data"]["path"]}
    assert cfg == type(cfg).model_validate(minimal)
    # every key is in the file with its description above it (optional sections commented out)
    for d in field_docs(type(cfg)):
        name = d.key.rsplit(".", 1)[-1]
        assert f"{name}:" in text, d.key
        assert d.description.split()[0] in text, d.key
    assert "REQUIRED" in text
    again = runner.invoke(app, ["config", "init", algo, "-o", str(path)])
    assert again.exit_code == 7 and "--overwrite" in again.output


def test_config_show_lists_every_key_with_default_and_description():
    r = runner.invoke(app, ["config", "show", "rl"], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    for key in ("rl.group_size", "rollout.max_new_tokens", "train.lr", "model.lora.target_modules", "rl.async_rollouts"):
        assert key in r.output, key
    line = next(ln for ln in r.output.splitlines() if "rl.group_size" in ln)
    assert "int" in line and " 8 " in line and "episodes sampled per task" in line
    assert "[q_proj, v_proj]" in r.output  # descriptions are not eaten as markup
    y = runner.invoke(app, ["config", "show", "sft", "--yaml"])
    assert y.exit_code == 0 and yaml.safe_load(y.output)["algorithm"] == "sft"
    bad = runner.invoke(app, ["config", "show", "ppo"])
    assert bad.exit_code == 2 and f"known: {', '.join(sorted(algorithms()))}" in bad.output
    assert "dualtune" in bad.output and "tfgrpo" in bad.output


def test_a_mistyped_key_gets_did_you_mean(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("algorithm: rl\nmodel: m\noutput_dir: o\nenv: home\nrl: {grup_size: 4}\ntrain: {lrr: 1}\nzzz: 1\n")
    with pytest.raises(ConfigError) as e:
        load_run_config(p)
    msg = str(e.value)
    assert "rl.grup_size: unknown key; did you mean rl.group_size?" in msg
    assert "train.lrr: unknown key; did you mean train.lr?" in msg
    assert "zzz: unknown key (check the spelling; `trajtune config show ALGORITHM`" in msg


def test_help_shows_value_types_and_no_bool_for_flags():
    r = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    assert "<path>" in r.output and "<list[str]>" in r.output
    assert "<bool>" not in r.output
    assert "--resume" in r.output
