"""Config validation: unknown keys, no-op combinations, overrides, YAML errors with line numbers."""

from __future__ import annotations

import pytest

from trajtune.config import ConfigError, RLRunConfig, SFTRunConfig, apply_overrides, load_config
from trajtune.errors import InputNotFoundError

BASE_SFT = "model: m\noutput_dir: out\ndata: {path: d.jsonl}\n"


def _write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_valid_sft_config_and_overrides(tmp_path):
    cfg = load_config(_write(tmp_path, BASE_SFT), SFTRunConfig, ["train.lr=3e-4", "model.lora.r=4", "data.format=sharegpt"])
    assert cfg.train.lr == pytest.approx(3e-4)
    assert cfg.model.name_or_path == "m" and cfg.model.lora.r == 4 and cfg.model.lora.alpha == 16
    assert cfg.data.format == "sharegpt"


@pytest.mark.parametrize("extra,needle", [
    ("trian: {steps: 3}\n", "trian: unknown key"),
    ("train: {stpes: 3}\n", "train.stpes: unknown key"),
    ("train: {eaft_top_k: 10}\n", "train.eaft is false"),
    ("train: {steps: 10, save_every: 10}\n", "no intermediate checkpoint"),
    ("train: {steps: 10, eval_every: 5}\n", "no eval.env"),
    ("train: {schedule: constant, min_lr_ratio: 0.5}\n", "no effect with schedule: constant"),
])
def test_sft_config_errors(tmp_path, extra, needle):
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, BASE_SFT + extra), SFTRunConfig)
    assert needle in str(e.value)
    assert str(tmp_path / "c.yaml") in str(e.value)


@pytest.mark.parametrize("extra,needle", [
    ("rl: {kl_estimator: k2}\n", "kl_coef is 0"),
    ("rl: {group_size: 1}\n", "zero advantages"),
    ("rl: {norm_length: 512}\n", "seq_mean_token_sum_norm"),
    ("train: {batch_size: 4}\n", "not used by RL"),
    ("rl: {termination: {length: explode}}\n", "rl.termination.length"),
])
def test_rl_config_errors(tmp_path, extra, needle):
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, "model: m\noutput_dir: o\nenv: home\n" + extra), RLRunConfig)
    assert needle in str(e.value)


def test_rl_config_ok_with_kl(tmp_path):
    cfg = load_config(_write(tmp_path, "model: m\noutput_dir: o\nenv: {name: home}\nrl: {kl_coef: 0.1, kl_estimator: k2}\n"),
                      RLRunConfig)
    assert cfg.rl.kl_estimator == "k2" and cfg.env.name == "home"


def test_yaml_syntax_error_names_the_line(tmp_path):
    p = _write(tmp_path, "model: m\noutput_dir: [unclosed\ndata: {path: x}\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:\d+: not valid YAML"):
        load_config(p, SFTRunConfig)


def test_missing_config_and_bad_override(tmp_path):
    with pytest.raises(InputNotFoundError, match="nope.yaml: no such file"):  # the same error as any missing input
        load_config(tmp_path / "nope.yaml", SFTRunConfig)
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        apply_overrides({}, ["train.lr"])
    with pytest.raises(ConfigError, match="is not a section"):
        apply_overrides({"train": 3}, ["train.lr=3"])


def test_example_configs_validate():
    from pathlib import Path

    ex = Path(__file__).parent.parent / "examples"
    cfgs = sorted(ex.glob("*.yaml"))
    assert len(cfgs) >= 3
    for p in cfgs:
        cls = RLRunConfig if p.name.startswith("rl_") else SFTRunConfig
        cfg = load_config(p, cls)
        assert cfg.output_dir.startswith("runs/")
