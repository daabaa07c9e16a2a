"""Config validation: unknown keys, no-op combinations, overrides, YAML errors with line numbers."""

from __future__ import annotations

import pytest

from trajtune.algorithms.registry import load_run_config

from trajtune.algorithms.rl import RLRunConfig
from trajtune.algorithms.sft import SFTRunConfig
from trajtune.config import ConfigError, apply_overrides, load_config
from trajtune.errors import InputNotFoundError

BASE_SFT = "model: m\noutput_dir: out\ndata: {path: d.jsonl}\n"


def _write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_step_in_backward_config_reaches_the_learner(tmp_path):
    from trajtune.train import learner_config
    from types import SimpleNamespace

    cfg = load_config(_write(tmp_path, BASE_SFT + "train: {step_in_backward: true, max_grad_norm: null, "
                                                  "batch_size: 4, micro_batch_size: 4}\n"), SFTRunConfig)
    lc = learner_config(cfg, SimpleNamespace(micro_batch_size=4, epochs=1, mini_batches=1))
    assert lc.step_in_backward is True and lc.max_grad_norm is None


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
    ("train: {step_in_backward: true}\n", "max_grad_norm (1.0) cannot clip"),
    ("train: {step_in_backward: true, max_grad_norm: null, batch_size: 8, micro_batch_size: 4}\n",
     "raise micro_batch_size to 8"),
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
    for p in cfgs:  # each names its algorithm (so `trajtune train --config` runs it); the file name starts with it
        if p.name.startswith("recipe_"):  # a multi-stage recipe (`trajtune recipe`; its stages: tests/test_recipe.py)
            from trajtune.recipe import load_recipe

            recipe, _ = load_recipe(p)
            assert recipe.output_dir.startswith("runs/") and len(recipe.stages) >= 3
            continue
        cfg = load_run_config(p)
        assert cfg.algorithm == p.name.split("_")[0] and cfg.output_dir.startswith("runs/")


def test_every_render_option_is_settable_from_yaml_and_set(tmp_path):
    from dataclasses import fields

    from trajtune.chat.render import RenderConfig
    from trajtune.config import RenderSpec

    # every render option except train_on (a data choice: data.train_on) has a config key
    assert {f.name for f in fields(RenderConfig)} - {"train_on"} == set(RenderSpec.model_fields)
    yaml_text = BASE_SFT + ("render: {tool_format: pythonic, end_of_turn: '<|im_end|>', reasoning: drop, "
                            "template_kwargs: {enable_thinking: false}}\n")
    cfg = load_config(_write(tmp_path, yaml_text), SFTRunConfig,
                      ["render.tool_format=hermes", "render.non_prefix=split", "render.system_role=fold"])
    rc = cfg.render.to_render_config(train_on=cfg.data.train_on)
    assert (rc.tool_format, rc.non_prefix, rc.system_role, rc.end_of_turn, rc.reasoning) == \
        ("hermes", "split", "fold", "<|im_end|>", "drop")
    assert rc.template_kwargs == {"enable_thinking": False} and rc.train_on == "hint"
    rl = load_config(None, RLRunConfig, ["render.tool_format=llama3_json", "render.end_of_turn=[a, b]"],
                     base={"model": "m", "output_dir": "o", "env": "home"})
    assert rl.render.tool_format == "llama3_json" and rl.render.end_of_turn == ["a", "b"]


@pytest.mark.parametrize("extra,needle", [
    ("render: {tool_format: xml}\n", "render.tool_format: Input should be"),
    ("render: {tool_fromat: hermes}\n", "render.tool_fromat: unknown key"),
    ("data: {path: d.jsonl, non_prefix: split}\n", "moved to render.non_prefix"),
])
def test_render_config_errors(tmp_path, extra, needle):
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, BASE_SFT + extra), SFTRunConfig)
    assert needle in str(e.value)


def test_render_options_outside_a_run_config():
    from trajtune.cli.eval_cmd import render_overrides
    from trajtune.config import load_render

    assert load_render(render_overrides(["render.tool_format=pythonic"])).tool_format == "pythonic"
    with pytest.raises(ConfigError, match="render.bogus: unknown key"):
        load_render(render_overrides(["render.bogus=1"]))
    with pytest.raises(ConfigError, match="only render"):
        render_overrides(["train.lr=1"])


def test_rl_eval_defaults_to_the_training_env_so_set_env_moves_both(tmp_path):
    p = _write(tmp_path, "model: m\noutput_dir: out\nenv: home\neval: {n_tasks: 10}\n")
    assert load_config(p, RLRunConfig).eval.env.name == "home"
    cfg = load_config(p, RLRunConfig, ["env=workspace"])
    assert cfg.env.name == "workspace" and cfg.eval.env.name == "workspace"
    p2 = _write(tmp_path, "model: m\noutput_dir: out\nenv: home\neval: {env: sokoban, n_tasks: 10}\n")
    assert load_config(p2, RLRunConfig, ["env=workspace"]).eval.env.name == "sokoban"  # an explicit choice stays
    assert load_config(_write(tmp_path, "model: m\noutput_dir: out\nenv: home\n"), RLRunConfig).eval is None


def test_readme_rl_commands_train_and_evaluate_on_one_env():
    """Every `trajtune rl` line of the README evaluates on the environment it trains on."""
    import shlex
    from pathlib import Path

    root = Path(__file__).parent.parent
    text = (root / "README.md").read_text().replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("trajtune rl ")]
    assert lines
    for ln in lines:
        argv = shlex.split(ln.split("#")[0])
        config = root / argv[argv.index("--config") + 1]
        sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
        cfg = load_config(config, RLRunConfig, sets)
        assert cfg.eval is not None and cfg.eval.env.name == cfg.env.name, ln


def test_unknown_rollout_parser_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="rollout.parser: unknown tool-call parser 'nope'"):
        load_config(_write(tmp_path, "model: m\noutput_dir: out\nenv: home\nrollout: {parser: nope}\n"), RLRunConfig)


def test_a_dumped_config_loads_back_unchanged(tmp_path):
    """A run's config.yaml spells out every default; it must be usable as --config again."""
    from pathlib import Path

    from trajtune.config import dump_config

    ex = Path(__file__).parent.parent / "examples"
    for p in sorted(ex.glob("*.yaml")):
        if p.name.startswith("recipe_"):  # recipes are not run configs (tests/test_recipe.py)
            continue
        cfg = load_run_config(p) if "algorithm" in p.read_text() else load_run_config(p, algorithm=p.name.split("_")[0])
        again = _write(tmp_path, dump_config(cfg))
        assert "algorithm:" in again.read_text()
        assert load_run_config(again) == cfg, p.name
