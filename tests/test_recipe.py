"""trajtune recipe: stages chained through their outputs, checked before anything runs, resumed at the
stage and step where they stopped, and shown on one report page."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

from trajtune.cli.main import app
from trajtune.errors import ConfigError, RunDirError
from trajtune.recipe import run_recipe

SFT = {"algorithm": "sft", "seed": 0, "data": {"format": "ir", "max_length": 512},
       "train": {"steps": 2, "lr": 3e-3, "batch_size": 4, "micro_batch_size": 4, "warmup_steps": 0},
       "report": False}
RL = {"algorithm": "rl", "seed": 0, "env": "home", "report": False,
      "rollout": {"max_turns": 2, "max_new_tokens": 12, "max_length": 512, "temperature": 1.0},
      "rl": {"tasks_per_step": 2, "group_size": 2, "n_train_tasks": 8},
      "train": {"steps": 3, "lr": 1e-3, "schedule": "constant", "micro_batch_size": 4, "save_every": 1,
                "keep_last": 5}}


def _recipe(tmp_path, tiny_dir, stages=None, **top) -> object:
    (tmp_path / "sft.yaml").write_text(yaml.safe_dump(SFT))
    (tmp_path / "rl.yaml").write_text(yaml.safe_dump(RL))
    stages = stages if stages is not None else [
        {"name": "data", "run": "generate", "generate": {"env": "home", "n": 8}},
        {"name": "sft", "run": "sft", "config": "sft.yaml", "data_from": "data"},
        {"name": "rl", "run": "rl", "config": "rl.yaml", "set": {"train.lr": 2e-3}},
        {"name": "eval-rl", "run": "eval", "eval": {"env": "home", "tasks": 3, "max_new_tokens": 8}},
        {"name": "merged", "run": "merge", "merge": {"method": "ta"}, "models": ["sft", "rl"]},
        {"name": "eval-sft", "run": "eval", "from": "sft", "eval": {"env": "home", "tasks": 3, "max_new_tokens": 8}},
    ]
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "out"), "model": str(tiny_dir), "report": True,
                                    "stages": stages, **top}, sort_keys=False))
    return path


def _weights(d):
    return load_file(str(d / "model.safetensors"))


def test_each_stage_starts_from_the_model_the_one_before_made(tmp_path, tiny_dir):
    status = run_recipe(_recipe(tmp_path, tiny_dir), quiet=True)
    out = tmp_path / "out"
    st = status["stages"]
    assert list(st) == ["data", "sft", "rl", "eval-rl", "merged", "eval-sft"] and status["finished"]
    # generate → sft: the expert file is the SFT data
    sft_cfg = yaml.safe_load((out / "sft" / "config.yaml").read_text())
    assert sft_cfg["data"]["path"] == str(out / "data" / "data.jsonl") and st["data"]["trajectories"] == 8
    assert sft_cfg["model"] in (str(tiny_dir), {"name_or_path": str(tiny_dir)}) or \
        sft_cfg["model"]["name_or_path"] == str(tiny_dir)
    # sft → rl: the RL run trains the SFT model, with the stage's override applied
    rl_cfg = yaml.safe_load((out / "rl" / "config.yaml").read_text())
    assert rl_cfg["model"]["name_or_path"] == str(out / "sft" / "final") and rl_cfg["train"]["lr"] == 2e-3
    assert rl_cfg["output_dir"] == str(out / "rl")
    # eval stages evaluate the latest model, or the one `from` names
    assert json.loads((out / "eval-rl" / "run.json").read_text())["model"] == str(out / "rl" / "final")
    assert json.loads((out / "eval-sft" / "run.json").read_text())["model"] == str(out / "sft" / "final")
    assert st["eval-rl"]["metrics"]["success"] == json.loads((out / "eval-rl" / "results.json").read_text())[
        "metrics"]["success"]
    # merge: base + (sft - base) + (rl - base), tensor by tensor
    base, sft, rl = _weights(tiny_dir), _weights(out / "sft" / "final"), _weights(out / "rl" / "final")
    merged = _weights(out / "merged")
    k = next(k for k in base if not torch.equal(sft[k], base[k]))
    torch.testing.assert_close(merged[k], base[k] + (sft[k] - base[k]) + (rl[k] - base[k]), atol=1e-6, rtol=0)
    assert status["model"] == str(out / "merged")  # the last model made (eval makes none)
    assert st["sft"]["seconds"] >= 0 and st["sft"]["peak_rss_mb"] > 0
    # one page: every stage a column, the training curves, episodes of every stage
    page = (out / "report.html").read_text()
    for name in ("data", "sft", "rl", "eval-rl", "merged", "eval-sft"):
        assert f"<th>{name}</th>" in page
    assert 'aria-label="loss"' in page and "eval-rl:eval" in page and "rl:rollouts" in page


def test_a_recipe_killed_in_a_stage_resumes_there_and_ends_where_an_uninterrupted_one_does(tmp_path, tiny_dir):
    path = _recipe(tmp_path, tiny_dir)
    run_recipe(path, quiet=True)
    out = tmp_path / "out"
    whole = _weights(out / "rl" / "final")
    # as if killed after RL's step-2 checkpoint (the last step writes final/, not a checkpoint): the
    # final model, step 3's metrics and the later stages gone
    assert (out / "rl" / "checkpoints" / "step-000002").is_dir()
    shutil.rmtree(out / "rl" / "final")
    (out / "rl" / "result.json").unlink()
    rows = (out / "rl" / "metrics.jsonl").read_text().splitlines()[:2]
    (out / "rl" / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    for later in ("eval-rl", "merged", "eval-sft"):
        shutil.rmtree(out / later)
    status = json.loads((out / "recipe.json").read_text())
    status["stages"] = {k: v for k, v in status["stages"].items() if k in ("data", "sft")}
    status.pop("finished")
    (out / "recipe.json").write_text(json.dumps(status))
    sft_mtime = (out / "sft" / "final" / "model.safetensors").stat().st_mtime_ns
    data_mtime = (out / "data" / "data.jsonl").stat().st_mtime_ns

    with pytest.raises(RunDirError, match="--resume"):
        run_recipe(path, quiet=True)  # a new run never lands on the unfinished one
    again = run_recipe(path, resume=True, quiet=True)
    assert (out / "sft" / "final" / "model.safetensors").stat().st_mtime_ns == sft_mtime  # not run again
    assert (out / "data" / "data.jsonl").stat().st_mtime_ns == data_mtime
    resumed = _weights(out / "rl" / "final")
    assert all(torch.equal(resumed[k], whole[k]) for k in whole)
    again_rows = (out / "rl" / "metrics.jsonl").read_text().splitlines()
    assert again_rows[:2] == rows and json.loads(again_rows[2])["step"] == 3  # steps 1-2 kept, only 3 trained
    assert again["finished"] and list(again["stages"]) == ["data", "sft", "rl", "eval-rl", "merged", "eval-sft"]

    # a stage that finished but was not yet recorded (killed between the two) is read back, not rerun
    status = json.loads((out / "recipe.json").read_text())
    del status["stages"]["eval-sft"]
    (out / "recipe.json").write_text(json.dumps(status))
    assert run_recipe(path, resume=True, quiet=True)["stages"]["eval-sft"]["metrics"] == again["stages"]["eval-sft"][
        "metrics"]

    # a changed recipe is not resumed silently
    changed = yaml.safe_load(path.read_text())
    changed["stages"][2]["set"]["train.lr"] = 5e-3
    path.write_text(yaml.safe_dump(changed))
    with pytest.raises(RunDirError, match=r"train\.lr"):
        run_recipe(path, resume=True, quiet=True)


def test_an_adapter_trained_in_one_stage_is_exported_and_evaluated_in_the_next(tmp_path, tiny_dir):
    (tmp_path / "lora.yaml").write_text(yaml.safe_dump({**SFT, "model": {"name_or_path": "x", "lora": {
        "r": 4, "alpha": 8, "target_modules": "all-linear"}}}))
    stages = [{"name": "data", "run": "generate", "generate": {"env": "home", "n": 8}},
              {"name": "sft", "run": "sft", "config": "lora.yaml", "data_from": "data"},
              {"name": "export", "run": "export"},
              {"name": "ev", "run": "eval", "eval": {"env": "home", "tasks": 2, "max_new_tokens": 4}}]
    status = run_recipe(_recipe(tmp_path, tiny_dir, stages, report=False), quiet=True)
    out = tmp_path / "out"
    assert (out / "sft" / "final" / "adapter_config.json").exists()  # the stage trained an adapter
    exported = json.loads((out / "export" / "export.json").read_text())  # folded into a plain model
    assert exported["source_adapter"] == str(out / "sft" / "final")  # the adapter the stage before made
    assert not (out / "export" / "adapter_config.json").exists()
    assert status["stages"]["export"]["model"] == str(out / "export")
    assert json.loads((out / "ev" / "run.json").read_text())["model"] == str(out / "export")


@pytest.mark.parametrize("stages, words", [
    ([{"name": "a", "run": "sfx", "config": "sft.yaml"}], "unknown run 'sfx'"),
    ([{"name": "a", "run": "sft", "config": "sft.yaml", "eval": {"env": "home"}}], "`eval` belongs to eval stage"),
    ([{"name": "a", "run": "eval"}], "needs its `eval:` section"),
    ([{"name": "a", "run": "sft", "config": "sft.yaml", "data_from": "b"},
      {"name": "b", "run": "generate", "generate": {"env": "home"}}], "'b' is not an earlier stage (it comes later)"),
    ([{"name": "a", "run": "generate", "generate": {"env": "home"}},
      {"name": "b", "run": "eval", "from": "a", "eval": {"env": "home"}}],
     "'a' is a generate stage, which makes no model"),
    ([{"name": "a", "run": "sft", "config": "sft.yaml"}, {"name": "a", "run": "rl", "config": "rl.yaml"}],
     "two stages are named 'a'"),
    ([{"name": "a", "run": "rl", "config": "rl.yaml", "set": {"output_dir": "x"}}], "set.output_dir is the recipe's"),
    ([{"name": "../a", "run": "rl", "config": "rl.yaml"}], "names a directory"),
    ([{"name": "a", "run": "rl", "config": "rl.yaml", "merge": {"method": "ta"}}], "`merge` belongs to merge stage"),
])
def test_a_recipe_that_would_misbehave_is_refused_naming_the_stage(tmp_path, tiny_dir, stages, words):
    with pytest.raises(ConfigError) as e:
        run_recipe(_recipe(tmp_path, tiny_dir, stages), quiet=True)
    assert words in str(e.value)
    assert not (tmp_path / "out").exists()


def test_every_stage_is_checked_before_the_first_runs(tmp_path, tiny_dir):
    stages = [{"name": "sft", "run": "sft", "config": "sft.yaml", "set": {"data.path": "x.jsonl"}},
              {"name": "rl", "run": "rl", "config": "rl.yaml", "set": {"rl.group_sise": 4}}]
    with pytest.raises(ConfigError, match=r"stage 'rl'.*group_sise"):
        run_recipe(_recipe(tmp_path, tiny_dir, stages), quiet=True)
    stages = [{"name": "sft", "run": "sft", "config": "sft.yaml", "set": {"data.path": "x.jsonl"}},
              {"name": "ev", "run": "eval", "eval": {"env": "home", "taks": 3}}]
    with pytest.raises(ConfigError, match=r"stage 'ev'.*taks"):
        run_recipe(_recipe(tmp_path, tiny_dir, stages), quiet=True)
    stages = [{"name": "ev", "run": "rl", "config": "rl.yaml"},
              {"name": "m", "run": "merge", "merge": {"method": "ta", "density": 0.5}}]
    with pytest.raises(ConfigError, match="density only applies to --method ties"):
        run_recipe(_recipe(tmp_path, tiny_dir, stages), quiet=True)
    assert not (tmp_path / "out").exists()


def test_the_cli_runs_a_recipe_and_refuses_an_existing_output(tmp_path, tiny_dir):
    stages = [{"name": "data", "run": "generate", "generate": {"env": "home", "n": 4}},
              {"name": "ev", "run": "eval", "eval": {"env": "home", "tasks": 2, "max_new_tokens": 4}}]
    path = _recipe(tmp_path, tiny_dir, stages, report=False)
    r = CliRunner().invoke(app, ["recipe", "--config", str(path), "-q"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["stages"]["data"]["trajectories"] == 4
    assert not (tmp_path / "out" / "report.html").exists()  # report: false
    r = CliRunner().invoke(app, ["recipe", "--config", str(path), "-q"])
    assert r.exit_code != 0 and "already holds a finished recipe" in r.output
    r = CliRunner().invoke(app, ["recipe", "--config", str(path), "-q", "--set", f"output_dir={tmp_path / 'o2'}"])
    assert r.exit_code == 0 and (tmp_path / "o2" / "recipe.json").exists()


@pytest.mark.parametrize("name", ["recipe_home.yaml", "recipe_smollm2_fncall.yaml"])
def test_the_shipped_recipes_validate_and_chain_their_stages(name, tmp_path):
    from pathlib import Path

    r = CliRunner().invoke(app, ["recipe", "--config", str(Path("examples") / name), "--check",
                                 "--set", f"output_dir={tmp_path / 'o'}"])
    assert r.exit_code == 0, r.output
    plan = {s["stage"]: s for s in json.loads(r.stdout)["stages"]}
    out = tmp_path / "o"
    assert plan["rl"]["model"] == str(out / "sft" / "final")  # RL continues the SFT stage's model
    assert plan["sft"]["makes"] == str(out / "sft" / "final")
    if name == "recipe_smollm2_fncall.yaml":
        assert plan["eval-base"]["model"] == "smollm2-135m" and plan["bfcl-rl"]["model"] == str(out / "rl" / "final")
        assert plan["export"]["model"] == str(out / "rl" / "final") and plan["export"]["makes"] == str(out / "export")
    assert not out.exists()  # --check runs nothing
