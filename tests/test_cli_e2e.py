"""End to end through the CLI on a tiny local model: sft, eval, rl, resume, and the bad-input paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from trajtune.cli.main import app
from trajtune.errors import ConfigError, DataError, ModelLoadError, RenderError, RunDirError
from trajtune.envs import make_env
from trajtune.schema import write_trajectories

runner = CliRunner()


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _heldout_loss(model_dir, trajs) -> float:
    from trajtune.algorithms.batch import collate
    from trajtune.algorithms.sft import SFTObjective
    from trajtune.chat.render import ChatRenderer
    from trajtune.models.loading import load_model, load_tokenizer

    tok = load_tokenizer(str(model_dir))
    model = load_model(str(model_dir)).eval()
    b = collate([ChatRenderer(tok).render(t) for t in trajs], tok.pad_token_id)
    obj = SFTObjective()
    with torch.no_grad():
        loss, _ = obj.loss_sum(model, b)
    return float(loss) / obj.denominator(b)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    env = make_env("home")
    d = tmp_path_factory.mktemp("data")
    write_trajectories(d / "train.jsonl", [env.expert(t) for t in env.tasks("train", 48, seed=1)])
    return d / "train.jsonl", [env.expert(t) for t in env.tasks("test", 8, seed=1)]


def _sft_yaml(tmp_path, tiny_dir, data_path, out, steps=8, extra=""):
    p = tmp_path / "sft.yaml"
    p.write_text(f"model: {tiny_dir}\noutput_dir: {out}\nseed: 0\n"
                 f"data: {{path: {data_path}, format: ir, max_length: 512}}\n"
                 f"train: {{steps: {steps}, lr: 3.0e-3, batch_size: 8, micro_batch_size: 4, warmup_steps: 1}}\n" + extra)
    return p


def test_sft_lowers_heldout_loss_then_eval_and_rl_run(tmp_path, tiny_dir, data):
    data_path, heldout = data
    out = tmp_path / "sft"
    before = _heldout_loss(tiny_dir, heldout)
    r = _invoke("sft", "--config", _sft_yaml(tmp_path, tiny_dir, data_path, out), "--quiet")
    assert r.exit_code == 0, r.output
    after = _heldout_loss(out / "final", heldout)
    assert after < before * 0.8, (before, after)
    assert (out / "config.yaml").exists() and (out / "loss.png").exists()
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r_["step"] for r_ in rows] == list(range(1, 9))

    ev = tmp_path / "eval"
    r = _invoke("eval", "--model", out / "final", "--env", "home", "--tasks", 4, "--max-turns", 4,
                "--max-new-tokens", 32, "--max-length", 512, "--out", ev, "--quiet")
    assert r.exit_code == 0, r.output
    doc = json.loads((ev / "results.json").read_text())
    assert doc["metrics"]["episodes"] == 4 and len((ev / "episodes.jsonl").read_text().splitlines()) == 4
    assert 0.0 <= doc["metrics"]["success"] <= 1.0

    rl_cfg = tmp_path / "rl.yaml"
    rl_cfg.write_text(f"model: {out / 'final'}\noutput_dir: {tmp_path / 'rl'}\nenv: home\n"
                      "rollout: {max_turns: 3, max_new_tokens: 32, max_length: 512, batch_size: 8}\n"
                      "rl: {tasks_per_step: 2, group_size: 4, n_train_tasks: 16}\n"
                      "train: {steps: 2, lr: 1.0e-4, micro_batch_size: 8}\n")
    r = _invoke("rl", "--config", rl_cfg, "--quiet")
    assert r.exit_code == 0, r.output
    rows = [json.loads(l) for l in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all("reward" in x and "success" in x for x in rows)
    assert (tmp_path / "rl" / "final" / "model.safetensors").exists()
    n_eps = len((tmp_path / "rl" / "rollouts.jsonl").read_text().splitlines())
    assert n_eps == 2 * 2 * 4


def test_lora_sft_saves_an_adapter_that_loads_back(tmp_path, tiny_dir, data):
    from trajtune.models.loading import load_model

    data_path, heldout = data
    out = tmp_path / "lora"
    cfg = _sft_yaml(tmp_path, tiny_dir, data_path, out, steps=4,
                    extra="").read_text().replace(f"model: {tiny_dir}",
                                                  f"model: {{name_or_path: {tiny_dir}, lora: {{r: 4, alpha: 8}}}}")
    (tmp_path / "lora.yaml").write_text(cfg)
    r = _invoke("sft", "--config", tmp_path / "lora.yaml", "--quiet")
    assert r.exit_code == 0, r.output
    final = out / "final"
    assert (final / "adapter_config.json").exists() and not (final / "model.safetensors").exists()
    m = load_model(str(final), trainable=False)
    assert hasattr(m, "peft_config")
    lora_b = [p for n, p in m.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)  # trained, not the zero init
    assert _heldout_loss(final, heldout) < _heldout_loss(tiny_dir, heldout)


def test_resume_via_cli_continues_to_the_end(tmp_path, tiny_dir, data):
    from trajtune.algorithms.sft import SFTRunConfig
    from trajtune.config import load_config
    from trajtune.train import run_sft

    data_path, _ = data
    out = tmp_path / "res"
    cfg = load_config(_sft_yaml(tmp_path, tiny_dir, data_path, out, steps=6,
                                extra=""), SFTRunConfig, ["train.save_every=2"])
    run_sft(cfg, quiet=True, stop_after=3)  # as if killed after step 3
    assert not (out / "final").exists()
    r = _invoke("sft", "--config", tmp_path / "sft.yaml", "--set", "train.save_every=2", "--resume", "--quiet")
    assert r.exit_code == 0, r.output
    steps = [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert (out / "final" / "model.safetensors").exists()


def test_bad_inputs_give_one_clear_message(tmp_path, tiny_dir, data):
    data_path, _ = data
    # existing output directory without --overwrite
    out = tmp_path / "exists"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    r = _invoke("sft", "--config", _sft_yaml(tmp_path, tiny_dir, data_path, out))
    assert r.exit_code == RunDirError.exit_code and "already exists" in r.output and "--overwrite" in r.output
    assert (out / "keep.txt").read_text() == "precious"
    # malformed config
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"model: {tiny_dir}\noutput_dir: {tmp_path / 'o1'}\ndata: {{path: {data_path}}}\ntrain: {{lr: -1}}\n")
    r = _invoke("sft", "--config", bad)
    assert r.exit_code == ConfigError.exit_code and "train.lr" in r.output and not (tmp_path / "o1").exists()
    # missing model path
    r = _invoke("sft", "--config", _sft_yaml(tmp_path, tmp_path / "no-such-model", data_path, tmp_path / "o2"))
    assert r.exit_code == ModelLoadError.exit_code and "does not exist" in r.output and not (tmp_path / "o2").exists()
    # a JSONL with a bad line
    broken = tmp_path / "broken.jsonl"
    lines = data_path.read_text().splitlines()
    broken.write_text("\n".join(lines[:3] + ['{"id": "x", "messages": [oops'] + lines[3:5]) + "\n")
    r = _invoke("sft", "--config", _sft_yaml(tmp_path, tiny_dir, broken, tmp_path / "o3"))
    assert r.exit_code == DataError.exit_code and "broken.jsonl:4" in r.output and not (tmp_path / "o3").exists()
    # a tokenizer without a chat template
    import shutil

    nochat = tmp_path / "nochat"
    shutil.copytree(tiny_dir, nochat)
    tc = json.loads((nochat / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (nochat / "tokenizer_config.json").write_text(json.dumps(tc))
    for f in nochat.glob("chat_template.*"):
        f.unlink()
    r = _invoke("sft", "--config", _sft_yaml(tmp_path, nochat, data_path, tmp_path / "o4"))
    assert r.exit_code == RenderError.exit_code and "no chat template" in r.output and not (tmp_path / "o4").exists()


def test_training_refuses_a_template_that_would_mis_mask_unless_split(tmp_path, tiny_dir, data):
    """A Qwen3-style template drops past <think> blocks: `sft` refuses it up front (doctor checks)
    with non_prefix: error, and trains with non_prefix: split."""
    import shutil

    data_path, _ = data
    q3 = tmp_path / "q3model"
    shutil.copytree(tiny_dir, q3)
    template = (Path(__file__).parent / "fixtures" / "templates" / "qwen3.jinja").read_text()
    tc = json.loads((q3 / "tokenizer_config.json").read_text())
    tc["chat_template"] = template
    (q3 / "tokenizer_config.json").write_text(json.dumps(tc))
    for f in q3.glob("chat_template.*"):
        f.unlink()
    out = tmp_path / "q3run"
    r = _invoke("sft", "--config", _sft_yaml(tmp_path, q3, data_path, out, steps=2))
    assert r.exit_code == RenderError.exit_code and "fails conformance checks" in r.output and "trajtune doctor" in r.output
    assert not out.exists()
    r = _invoke("sft", "--config", _sft_yaml(tmp_path, q3, data_path, out, steps=2), "--set", "render.non_prefix=split",
                "--set", "data.max_length=100")
    assert r.exit_code == DataError.exit_code and "longer than data.max_length (100)" in r.output
    r = _invoke("sft", "--config", _sft_yaml(tmp_path, q3, data_path, out, steps=2), "--set", "render.non_prefix=split",
                "--set", "data.max_length=4096", "--quiet")
    assert r.exit_code == 0, r.output
    assert (out / "final" / "model.safetensors").exists()


def test_rl_killed_between_checkpoints_resumes_to_the_same_rollouts_and_weights(tmp_path, tiny_dir):
    import shutil

    from safetensors.torch import load_file

    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config
    from trajtune.train import run_rl

    def cfg(out):
        return load_config(None, RLRunConfig, [f"model={tiny_dir}", f"output_dir={out}", "env=home",
                                                "rollout.max_turns=2", "rollout.max_new_tokens=16",
                                                "rollout.max_length=512", "rl.tasks_per_step=2", "rl.group_size=2",
                                                "rl.n_train_tasks=8", "rl.drop_equal_groups=false", "train.steps=3",
                                                "train.lr=1e-3", "train.save_every=1", "train.keep_last=5"])

    run_rl(cfg(tmp_path / "full"), quiet=True)
    run_rl(cfg(tmp_path / "killed"), quiet=True, stop_after=2)
    shutil.rmtree(tmp_path / "killed" / "checkpoints" / "step-000002")  # killed after step 2's rollouts, before its checkpoint
    logged = [json.loads(l)["step"] for l in (tmp_path / "killed" / "rollouts.jsonl").read_text().splitlines()]
    assert logged == [1] * 4 + [2] * 4
    run_rl(cfg(tmp_path / "killed"), quiet=True, resume=True)

    full = (tmp_path / "full" / "rollouts.jsonl").read_text()
    assert [json.loads(l)["step"] for l in full.splitlines()] == [1] * 4 + [2] * 4 + [3] * 4
    assert (tmp_path / "killed" / "rollouts.jsonl").read_text() == full  # no doubled step-2 episodes
    a = load_file(tmp_path / "full" / "final" / "model.safetensors")
    b = load_file(tmp_path / "killed" / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
