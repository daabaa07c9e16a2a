"""Sharded training (``train.sharding: fsdp``, PyTorch FSDP2) on 2 CPU processes (gloo): the same
weights, losses and gradient norms as one process on the same global batch, for SFT and RL (with a
sharded reference model); exact resume; checkpoints in the unsharded format, so a run resumes under
the other layout; and the configurations it cannot run refused with the key named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from wire_fixtures import launch_two, torchrun

from trajtune.cli.main import app

runner = CliRunner()


def _why(p) -> str:
    keys = ("Error", "error:", "Traceback", "abort")
    said = [ln for ln in p.stderr.splitlines() if any(k in ln for k in keys)][:30]
    return "\n".join(said) + "\n---\n" + p.stderr[-3000:]


def _weights(run: Path, sub: str = "final") -> dict[str, torch.Tensor]:
    return load_file(str(run / sub / "model.safetensors"))


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _one_process(cfg: Path, out: Path, *extra: str) -> None:
    r = runner.invoke(app, ["train", "--config", str(cfg), "--set", f"output_dir={out}", "-q", *extra],
                      catch_exceptions=False)
    assert r.exit_code == 0, r.output


def _assert_same_run(a: Path, b: Path, atol: float = 2e-5) -> None:
    """Weights within float rounding, and the same loss, gradient norm and tokens at every step (the
    gradient norm is what a wrong normalisation across ranks would change: Adam hides a scale)."""
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], atol=atol, rtol=1e-4)
    for x, y in zip(_metrics(a), _metrics(b), strict=True):
        assert x["step"] == y["step"] and x.get("tokens") == y.get("tokens")
        assert x["loss"] == pytest.approx(y["loss"], abs=1e-5)
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-4)


@pytest.fixture(scope="module")
def sft_cfg(tmp_path_factory, tiny_dir, home_experts) -> Path:
    from trajtune.schema import write_trajectories

    tmp = tmp_path_factory.mktemp("shard")
    write_trajectories(tmp / "data.jsonl", home_experts[:40])
    cfg = tmp / "sft.yaml"
    # 5 rows per step in micro-batches of 2: rank 0 trains rows 0, 2, 4 (2 micro-batches), rank 1 rows 1, 3
    # (1 micro-batch), so rank 1 runs one zero-weighted pass to stay in step with rank 0
    cfg.write_text(f"algorithm: sft\nmodel: {tiny_dir}\nseed: 0\nreport: false\n"
                   f"data: {{path: {tmp / 'data.jsonl'}, format: ir}}\n"
                   "train: {steps: 4, lr: 1.0e-3, batch_size: 5, micro_batch_size: 2, schedule: constant, "
                   "save_every: 2, sharding: fsdp}\n")
    return cfg


@pytest.fixture(scope="module")
def sft_runs(sft_cfg, tmp_path_factory) -> tuple[Path, Path]:
    """(the 2-process sharded run, the 1-process run) of ``sft_cfg``, uninterrupted."""
    tmp = tmp_path_factory.mktemp("shard_runs")
    p = torchrun("train", "--config", str(sft_cfg), "--set", f"output_dir={tmp / 'two'}", "-q")
    assert p.returncode == 0, _why(p)
    assert p.stdout.count('"step": 4') == 1  # one result, from rank 0
    _one_process(sft_cfg, tmp / "one")
    return tmp / "two", tmp / "one"


def test_sharded_sft_on_two_processes_trains_like_one_and_resumes_exactly(sft_cfg, sft_runs, tiny_dir, tmp_path):
    two, one = sft_runs
    start = load_file(str(Path(tiny_dir) / "model.safetensors"))
    assert any(not torch.equal(_weights(one)[k], start[k]) for k in start)
    _assert_same_run(one, two)
    assert json.loads((two / "final" / "config.json").read_text())["model_type"] == "qwen2"  # a plain HF dir
    # the checkpoint's optimizer state, gathered from the shards, is the unsharded run's (same format)
    sa, sb = (torch.load(r / "checkpoints" / "step-000002" / "trainer_state.pt", weights_only=False)["optimizer"]
              for r in (one, two))
    assert sa["state"].keys() == sb["state"].keys() and len(sa["param_groups"]) == len(sb["param_groups"])
    for i in sa["state"]:
        torch.testing.assert_close(sb["state"][i]["exp_avg_sq"], sa["state"][i]["exp_avg_sq"], atol=1e-9, rtol=1e-3)

    # killed after step 3: resume from the step-2 checkpoint on 2 processes → the uninterrupted weights, bit for bit
    killed = tmp_path / "killed"
    shutil.copytree(two, killed)
    shutil.rmtree(killed / "final")
    (killed / "result.json").unlink()
    (killed / "metrics.jsonl").write_text("\n".join((killed / "metrics.jsonl").read_text().splitlines()[:3]) + "\n")
    p = torchrun("train", "--config", str(sft_cfg), "--set", f"output_dir={killed}", "--resume", "-q")
    assert p.returncode == 0, _why(p)
    resumed, uninterrupted = _weights(killed), _weights(two)
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)
    assert [m["step"] for m in _metrics(killed)] == [1, 2, 3, 4]


def test_a_checkpoint_resumes_under_the_other_layout(sft_cfg, sft_runs, tmp_path):
    """The 1-process run's checkpoint continued by 2 sharded processes, and the sharded run's by one
    process: both end where the uninterrupted runs do (the checkpoint format is the same)."""
    two, one = sft_runs
    for src, layout in ((one, "two"), (two, "one")):
        run = tmp_path / f"from-{src.name}"
        shutil.copytree(src, run)
        shutil.rmtree(run / "final")
        (run / "result.json").unlink()
        shutil.rmtree(run / "checkpoints" / "step-000002")  # keep_last 2: only step 2 is written (4 is final)
        shutil.copytree(src / "checkpoints" / "step-000002", run / "checkpoints" / "step-000002")
        if layout == "two":
            p = torchrun("train", "--config", str(sft_cfg), "--set", f"output_dir={run}", "--resume", "-q")
            assert p.returncode == 0, _why(p)
        else:
            _one_process(sft_cfg, run, "--resume")
        for k, v in _weights(one).items():
            torch.testing.assert_close(_weights(run)[k], v, atol=2e-5, rtol=1e-4)


def test_sharded_rl_with_a_sharded_reference_samples_and_trains_like_one_process(tmp_path, talker):
    """Every rank samples every group (a sharded forward needs all ranks), with the seeds one process
    uses, so the rollouts are the 1-process run's and so are the weights; the KL reference is sharded too."""
    cfg = tmp_path / "rl.yaml"
    cfg.write_text(f"algorithm: rl\nmodel: {talker}\nenv: wire_envs:Reply\nseed: 0\nreport: false\n"
                   "rollout: {max_turns: 1, max_new_tokens: 8, max_length: 256, temperature: 1.0}\n"
                   "rl: {tasks_per_step: 3, group_size: 4, n_train_tasks: 16, kl_coef: 0.1}\n"
                   "train: {steps: 3, lr: 1.0e-3, micro_batch_size: 4, schedule: constant, sharding: fsdp}\n")
    p = torchrun("train", "--config", str(cfg), "--set", f"output_dir={tmp_path / 'two'}", "-q")
    assert p.returncode == 0, _why(p)
    _one_process(cfg, tmp_path / "one")
    rows = [[json.loads(x) for x in (tmp_path / d / "rollouts.jsonl").read_text().splitlines()] for d in ("one", "two")]
    assert len(rows[0]) == 36 and [r["messages"] for r in rows[1]] == [r["messages"] for r in rows[0]]
    metrics = _metrics(tmp_path / "two")
    assert all(0 < m["reward"] < 1 for m in metrics)  # mixed groups: real advantages, not rounding noise
    assert any(m["kl"] != 0.0 for m in metrics[1:])  # the reference was used
    _assert_same_run(tmp_path / "one", tmp_path / "two")


def test_sharded_sft_with_gradient_checkpointing_trains_like_one_process(sft_cfg, tmp_path):
    """Recomputed layers gather their shards again in the backward pass; the step is the same."""
    extra = ["--set", "train.gradient_checkpointing=true"]
    p = torchrun("train", "--config", str(sft_cfg), "--set", f"output_dir={tmp_path / 'two'}", "-q", *extra)
    assert p.returncode == 0, _why(p)
    _one_process(sft_cfg, tmp_path / "one", *extra)
    _assert_same_run(tmp_path / "one", tmp_path / "two")


@pytest.mark.slow
def test_sharded_lora_sft_trains_the_adapter_like_one_process(sft_cfg, tmp_path):
    overrides = ["--set", "model.lora={r: 4, alpha: 8}", "--set", "train.lr=1.0e-2"]
    p = torchrun("train", "--config", str(sft_cfg), "--set", f"output_dir={tmp_path / 'two'}", "-q", *overrides)
    assert p.returncode == 0, _why(p)
    _one_process(sft_cfg, tmp_path / "one", *overrides)
    one, two = (load_file(str(tmp_path / d / "final" / "adapter_model.safetensors")) for d in ("one", "two"))
    assert one.keys() == two.keys() and any(float(v.abs().max()) > 0 for k, v in one.items() if "lora_B" in k)
    for k in one:
        torch.testing.assert_close(two[k], one[k], atol=2e-5, rtol=1e-4)
    # and a resume of the sharded adapter run from its step-2 checkpoint ends on the same adapter
    run = tmp_path / "resumed"
    shutil.copytree(tmp_path / "two", run)
    shutil.rmtree(run / "final")
    (run / "result.json").unlink()
    p = torchrun("train", "--config", str(sft_cfg), "--set", f"output_dir={run}", "--resume", "-q", *overrides)
    assert p.returncode == 0, _why(p)
    resumed = load_file(str(run / "final" / "adapter_model.safetensors"))
    assert all(torch.equal(resumed[k], two[k]) for k in two)


def test_a_crashed_rank_stops_a_sharded_run_clearly_and_it_resumes_to_the_uninterrupted_weights(sft_cfg, sft_runs,
                                                                                                 tmp_path):
    two, _ = sft_runs
    run = tmp_path / "crashed"
    procs = launch_two("train", "--config", str(sft_cfg), "--set", f"output_dir={run}", "-q",
                        env={"TRAJTUNE_TEST_CRASH_RANK": "1", "TRAJTUNE_TEST_CRASH_STEP": "3",
                             "TRAJTUNE_DIST_TIMEOUT_S": "60"})
    outs = [p.communicate(timeout=300) for p in procs]
    assert procs[1].returncode == 17 and procs[0].returncode == 9, outs[0][1][-3000:]
    assert [ln for ln in outs[0][1].splitlines() if ln.startswith("error:")] == [
        "error: rank 1 lost at step 3; resume with the same command and --resume: the last checkpoint is step 2 "
        "(seen by rank 0)"], outs[0][1][-3000:]
    p = torchrun("train", "--config", str(sft_cfg), "--set", f"output_dir={run}", "--resume", "-q")
    assert p.returncode == 0, _why(p)
    assert all(torch.equal(_weights(run)[k], v) for k, v in _weights(two).items())


def test_a_peer_failure_inside_torch_becomes_rank_failed_and_other_errors_pass(monkeypatch):
    """A sharded forward's parameter gathers are torch's own collectives: their failure (gloo's
    "Connection closed by peer") is a lost rank, any other RuntimeError is still a bug."""
    from trajtune import distributed as dist
    from trajtune.errors import RankFailed

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(RankFailed, match=r"rank 1 lost \(a sharded forward: .*Connection closed by peer"):
        with dist.peer_failures("a sharded forward"):
            raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1")
    with pytest.raises(RuntimeError, match="shape mismatch") as e:
        with dist.peer_failures("a sharded forward"):
            raise RuntimeError("shape mismatch")
    assert not isinstance(e.value, RankFailed)


def _refused(overrides: list[str], algorithm: str, needle: str) -> None:
    from trajtune.algorithms.registry import load_run_config
    from trajtune.errors import ConfigError
    from trajtune.train import run

    with pytest.raises(ConfigError, match=needle):
        cfg = load_run_config(None, overrides, algorithm=algorithm)
        run(cfg)


def test_sharding_settings_that_cannot_apply_are_refused_naming_the_key(tmp_path, tiny_dir, monkeypatch):
    base = [f"model={tiny_dir}", f"output_dir={tmp_path / 'r'}"]
    sft = [*base, f"data={{path: {tmp_path / 'd.jsonl'}}}"]
    _refused([*sft, "train.sharding=zero3"], "sft", r"train.sharding: Input should be 'none' or 'fsdp'")
    _refused([*sft, "train.sharding=fsdp", "model.dtype=bfloat16"], "sft", "train.sharding: fsdp trains float32.*"
             "model.dtype: bfloat16")
    _refused([*base, "env=home", "train.sharding=fsdp", "rl.credit=gae"], "rl",
             "rl.credit: gae .*train.sharding: fsdp")
    _refused([*sft, "train.sharding=fsdp"], "dualtune", "train.sharding: fsdp is not supported by algorithm: dualtune")
    _refused([*base, "env=home", "train.sharding=fsdp"], "tfgrpo", "train.sharding does nothing in tfgrpo")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    _refused(sft, "sft", "an FSDP config, but train.sharding is none")
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    _refused([*sft, "train.sharding=fsdp"], "sft", "DeepSpeed config, which trajtune does not apply")
    assert not (tmp_path / "r").exists()


def test_adapter_keys_name_the_parameter_behind_every_saved_key_of_each_adapter(tmp_path):
    """What a sharded resume loads by: each key ``save_pretrained`` writes for an adapter → the trainable
    parameter it came from (the same values once saved), for the default adapter and a second one."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trajtune import sharding

    torch.manual_seed(0)
    base = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"],
                                            init_lora_weights=False))
    model.add_adapter("other", LoraConfig(r=2, lora_alpha=4, target_modules=["v_proj"], init_lora_weights=False))
    for n, p in model.named_parameters():  # both adapters trained, as with an adapter per role
        p.requires_grad_("lora_" in n)
    model.save_pretrained(tmp_path)
    params = dict(model.named_parameters())
    for name, sub in (("default", tmp_path), ("other", tmp_path / "other")):
        saved = load_file(str(sub / "adapter_model.safetensors"))
        keys = sharding.adapter_keys(model, name)
        assert set(keys) == set(saved) and len(set(keys.values())) == len(saved) == (8 if name == "default" else 4)
        for k, p in keys.items():
            assert f".{name}." in p and torch.equal(params[p].detach(), saved[k])
