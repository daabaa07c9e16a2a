"""LoRA RL as users run it: the KL reference is the step-0 policy held inside the LoRA model (adapter
off for a fresh adapter, the saved adapter weights for a continued one), checkpoints hold the adapter
only, and a run resumes exactly."""

from __future__ import annotations

import json

import pytest
import torch

from model_fixtures import randomize_lora_b

from trajtune.algorithms.batch import collate, token_logprobs
from trajtune.errors import ConfigError
from trajtune.models.loading import LoraConfig, load_model
from trajtune.models.reference import AdapterReference
from trajtune.tokens import SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory


@pytest.fixture(scope="module")
def adapter(tiny_dir, tiny_tok, tmp_path_factory):
    """A saved LoRA adapter on the tiny model with non-zero B (so it changes the model)."""
    model = load_model(str(tiny_dir), lora=LoraConfig(r=4, alpha=8))
    randomize_lora_b(model, seed=3, scale=0.2)
    out = tmp_path_factory.mktemp("adapter") / "sft-final"
    model.save_pretrained(out)
    tiny_tok.save_pretrained(out)  # as an SFT run's final directory holds it
    return out


def _batch():
    ids = [[5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 7, 20, 21, 22]]
    tts = [TokenTrajectory(ids=i, source=[SOURCE_PROMPT] * 3 + [SOURCE_POLICY] * (len(i) - 3), turn=[0] * len(i),
                           weight=[1.0] * len(i)) for i in ids]
    return collate(tts, 0)


def _logp(model):
    model.eval()
    with torch.no_grad():
        return token_logprobs(model, _batch())[0]


def _perturb(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 0.3)


def test_fresh_adapter_reference_is_the_base_with_the_adapter_off(tiny_dir):
    policy = load_model(str(tiny_dir), lora=LoraConfig(r=4, alpha=8))
    ref = AdapterReference(policy, fresh=True)
    _perturb(policy, 1)  # as if trained: the policy moved away from the base
    base = _logp(load_model(str(tiny_dir)))
    moved = _logp(policy)
    assert not torch.allclose(moved, base, atol=1e-4)
    assert torch.allclose(token_logprobs(ref, _batch())[0], base, atol=1e-6)
    assert torch.allclose(_logp(policy), moved)  # the adapter is back on


def test_continued_adapter_reference_is_the_saved_adapter_and_training_weights_come_back(adapter):
    policy = load_model(str(adapter))  # trainable: the adapter goes on training
    policy.train()
    ref = AdapterReference(policy, fresh=False)
    _perturb(policy, 2)
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    saved = _logp(load_model(str(adapter), trainable=False))
    policy.train()
    got = token_logprobs(ref, _batch())[0]
    assert torch.allclose(got, saved, atol=1e-6)
    assert policy.training  # the reference's forward (in eval mode) restored the mode
    after = dict(policy.named_parameters())
    assert all(torch.equal(after[n], v) for n, v in before.items())
    assert not torch.allclose(_logp(policy), saved, atol=1e-4)
    # the snapshot is the adapter only: a few tensors, nothing of the base
    assert ref.snapshot and all("lora_" in n for n in ref.snapshot)


def _rl_args(model, out, extra=()):
    return [f"model={model}", f"output_dir={out}", "env=home", "rollout.max_turns=2", "rollout.max_new_tokens=8",
            "rl.tasks_per_step=2", "rl.group_size=2", "train.steps=2", "train.save_every=1", "train.lr=1e-2",
            "rl.kl_coef=0.1", "rl.reward={terms: {length: -0.1}}", "report=false", *extra]  # length varies: advantages


def test_rl_from_an_adapter_with_kl_loads_no_second_model_saves_the_adapter_only_and_resumes_exactly(
        adapter, tmp_path, monkeypatch):
    import trajtune.train as train_mod
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config
    from trajtune.train import run

    loads = []
    real = train_mod.load_model
    monkeypatch.setattr(train_mod, "load_model", lambda *a, **k: loads.append(a) or real(*a, **k))
    out = tmp_path / "rl"
    run(load_config(None, RLRunConfig, _rl_args(adapter, out)), quiet=True)
    assert len(loads) == 1  # the policy only: the reference lives inside it
    for d in [out / "final", *sorted((out / "checkpoints").glob("step-*"))]:
        assert (d / "adapter_model.safetensors").exists() and not (d / "model.safetensors").exists(), d
    from safetensors.torch import load_file

    trained = load_file(out / "final" / "adapter_model.safetensors")
    start = load_file(adapter / "adapter_model.safetensors")
    assert any(not torch.equal(trained[k], start[k]) for k in start)  # the adapter changed
    logs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(abs(m.get("kl", 0.0)) > 0 for m in logs[1:])  # the reference differs from the moved policy
    # killed after step 1, resumed: the same adapter as the uninterrupted run
    cut = tmp_path / "cut"
    run(load_config(None, RLRunConfig, _rl_args(adapter, cut)), quiet=True, stop_after=1)
    run(load_config(None, RLRunConfig, _rl_args(adapter, cut)), quiet=True, resume=True)
    again = load_file(cut / "final" / "adapter_model.safetensors")
    assert all(torch.equal(again[k], trained[k]) for k in trained)


def test_an_adapter_directory_with_a_new_lora_says_which_to_train(adapter, tmp_path):
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config
    from trajtune.train import run

    cfg = load_config(None, RLRunConfig, _rl_args(adapter, tmp_path / "x", ["model.lora={r: 4}"]))
    with pytest.raises(ConfigError, match="drop model.lora to go on training that adapter.*trajtune export"):
        run(cfg, quiet=True)
    assert not (tmp_path / "x").exists()
