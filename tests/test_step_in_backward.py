"""train.step_in_backward: each weight updated as its gradient completes, inside the backward pass.

The claim is exactness: the same weights, optimizer state and logged grad norm as the ordinary step
without clipping, on the cases where a weight's gradient has several contributions in one backward
pass (tied embeddings, a prefix-shared group's two passes, gradient checkpointing's recomputation,
LoRA), and an exact resume. The combinations it cannot serve are refused, not approximated."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from trajtune.algorithms.policy_gradient import PolicyGradientObjective
from trajtune.errors import ConfigError
from trajtune.learner import Learner, LearnerConfig
from trajtune.step_in_backward import StepInBackward

from decoder_fixtures import checkpointing, float64_norms, grpo_group, lora, make_model, multi_turn

torch.set_num_threads(1)
PG = PolicyGradientObjective(clip_low=0.2, clip_high=0.28, kl_coef=0.0, temperature=0.9)


@pytest.fixture(autouse=True)
def float64(monkeypatch):
    float64_norms(monkeypatch)


def _experience(step: int):
    g = torch.Generator().manual_seed(100 + step)
    return grpo_group(g, 30, (5, 11, 3, 17), "a", 0) + multi_turn(g)  # 7 rows: a group and episodes of a task


def _run(tmp_path, name, make, in_backward: bool, steps=3, micro=16, clip=None, **cfg_kw):
    model = make()
    cfg = LearnerConfig(steps=steps, lr=2e-2, schedule="constant", micro_batch_size=micro, max_grad_norm=clip,
                        step_in_backward=in_backward, weight_decay=0.1, **cfg_kw)
    learner = Learner(model, SimpleNamespace(pad_token_id=0), PG, SimpleNamespace(), cfg, tmp_path / name)
    metrics = [learner.train_step(_experience(s)) for s in range(steps)]
    return learner, model, metrics


def _trainable(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("make", [
    pytest.param(lambda: make_model("qwen2"), id="qwen2-tied-embeddings"),
    pytest.param(lambda: checkpointing(make_model("llama")), id="llama-gradient-checkpointing"),
    pytest.param(lambda: lora(make_model("qwen2")), id="qwen2-lora"),
    pytest.param(lambda: lora(checkpointing(make_model("qwen2"))), id="qwen2-lora-checkpointing"),
])
def test_same_weights_optimizer_state_and_grad_norm_as_the_ordinary_step(tmp_path, make):
    start = _trainable(make())
    plain_l, plain, m0 = _run(tmp_path, "plain", make, False)
    inb_l, inb, m1 = _run(tmp_path, "inb", make, True)
    w0, w1 = _trainable(plain), _trainable(inb)
    assert w0.keys() == w1.keys() == start.keys()
    assert any(float((w0[n] - start[n]).abs().max()) > 1e-3 for n in w0)  # the steps did move the weights
    for n in w0:
        assert float((w0[n] - w1[n]).abs().max()) <= 1e-12, n
    s0, s1 = plain_l.optimizer.state_dict()["state"], inb_l.optimizer.state_dict()["state"]
    assert s0.keys() == s1.keys() and s0
    for k in s0:
        assert float(s0[k]["step"]) == float(s1[k]["step"]) == 3.0
        for buf in ("exp_avg", "exp_avg_sq"):
            assert float((s0[k][buf] - s1[k][buf]).abs().max()) <= 1e-12
    for a, b in zip(m0, m1):
        assert abs(a["loss"] - b["loss"]) <= 1e-12 and a["grad_norm"] > 0
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-9 * a["grad_norm"]
    # every trainable weight was stepped inside the backward pass, and no gradient is left behind
    assert inb_l.in_backward.stepped == len(w1)
    assert all(p.grad is None for p in inb.parameters())


def test_the_tied_embedding_is_stepped_once_with_both_contributions(tmp_path):
    """The input embedding and the LM head are one tensor: its gradient has a contribution from each
    end of the model, and the update must see their sum, once."""
    model = make_model("qwen2")
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    seen: list[float] = []
    emb = model.get_input_embeddings().weight
    emb.register_post_accumulate_grad_hook(lambda p: seen.append(float(p.grad.norm())))
    cfg = LearnerConfig(steps=1, lr=1e-2, micro_batch_size=16, max_grad_norm=None, step_in_backward=True)
    learner = Learner(model, SimpleNamespace(pad_token_id=0), PG, SimpleNamespace(), cfg, tmp_path / "run")
    learner.train_step(_experience(0))
    assert len(seen) == 1 and seen[0] > 0
    assert float(learner.optimizer.state_dict()["state"][0]["step"]) == 1.0


def test_kill_and_resume_equals_uninterrupted(tmp_path):
    from trajtune.experience import DatasetSource

    g = torch.Generator().manual_seed(5)
    rows = [r for k in range(4) for r in grpo_group(g, 20, (4, 7), f"g{k}", 10 * k)]

    def learner(out, stop_after=None):
        torch.manual_seed(0)
        cfg = LearnerConfig(steps=4, lr=1e-2, schedule="constant", micro_batch_size=16, max_grad_norm=None,
                            step_in_backward=True, save_every=2)
        tok = SimpleNamespace(pad_token_id=0, save_pretrained=lambda path: None)
        return Learner(make_model("qwen2"), tok, PG, DatasetSource(rows, 4, seed=0),
                       cfg, out, stop_after=stop_after)

    full = learner(tmp_path / "full")
    full.fit()
    killed = learner(tmp_path / "resumed", stop_after=3)
    killed.fit()
    fresh = learner(tmp_path / "resumed")
    assert fresh.resume() == 2
    fresh.fit()
    want, got = _trainable(full.model), _trainable(fresh.model)
    for n in want:
        assert torch.equal(want[n], got[n]), n
    norms = [json.loads(x)["grad_norm"] for x in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert len(norms) == 4 and all(x > 0 for x in norms)


def test_an_update_over_several_micro_batches_is_refused_before_any_weight_changes(tmp_path):
    model = make_model("qwen2")
    before = _trainable(model)
    cfg = LearnerConfig(steps=1, lr=1e-2, micro_batch_size=3, max_grad_norm=None, step_in_backward=True)
    learner = Learner(model, SimpleNamespace(pad_token_id=0), PG, SimpleNamespace(), cfg, tmp_path / "run")
    with pytest.raises(ConfigError, match=r"7 rows in 3 micro-batches.*micro_batch_size"):
        learner.train_step(_experience(0))
    after = _trainable(model)
    assert all(torch.equal(before[n], after[n]) for n in before)


def test_clipping_is_refused_by_the_learner_and_the_config(tmp_path):
    from trajtune.config import TrainSpec

    cfg = LearnerConfig(steps=1, lr=1e-2, max_grad_norm=1.0, step_in_backward=True)
    with pytest.raises(ConfigError, match="max_grad_norm: null"):
        Learner(make_model("qwen2"), SimpleNamespace(pad_token_id=0), PG, SimpleNamespace(), cfg, tmp_path / "r")
    with pytest.raises(ValueError, match=r"max_grad_norm \(1.0\) cannot clip"):
        TrainSpec(step_in_backward=True)
    with pytest.raises(ValueError, match="sharding: fsdp"):
        TrainSpec(step_in_backward=True, max_grad_norm=None, sharding="fsdp")
    assert TrainSpec(step_in_backward=True, max_grad_norm=None).step_in_backward


def test_without_clipping_the_ordinary_step_logs_the_unclipped_norm(tmp_path):
    """max_grad_norm: null leaves the gradients as they are (the same weights as a clip far above the
    norm, not those of a clip below it), and the logged norm is theirs."""
    runs = {}
    for name, clip in (("none", None), ("far-above", 1e9), ("below", 1e-4)):
        learner, model, metrics = _run(tmp_path, name, lambda: make_model("qwen2"), False, steps=2, clip=clip)
        runs[name] = (_trainable(model), metrics)
    (w_none, m_none), (w_above, m_above), (w_below, _) = runs["none"], runs["far-above"], runs["below"]
    assert all(torch.equal(w_none[n], w_above[n]) for n in w_none)
    assert max(float((w_none[n] - w_below[n]).abs().max()) for n in w_none) > 1e-6
    assert [m["grad_norm"] for m in m_none] == [m["grad_norm"] for m in m_above]
    assert all(m["grad_norm"] > 1e-4 for m in m_none)  # so the low clip did apply


def test_hooks_do_nothing_outside_the_learners_backward_pass():
    model = make_model("qwen2")
    params = [p for p in model.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-2)
    released: list[int] = []
    inb = StepInBackward(opt, params, release=lambda: released.append(1), release_every=1)
    ids = torch.tensor([[3, 4, 5, 6]])
    before = _trainable(model)
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None for p in params) and not opt.state and not released
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    model.zero_grad(set_to_none=True)
    with inb.active():
        model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is None for p in params) and len(opt.state) == len(params)
    # once on entering, then (release_every 1 byte) after every freed gradient
    assert inb.stepped == len(params) and len(released) == 1 + len(params)
    inb.remove()


@pytest.mark.slow
def test_real_model_full_weights_sft_equals_the_ordinary_step(tmp_path):
    """SmolLM2-135M (from its shipped GGUF: tied 49,152-token embeddings), float32, gradient
    checkpointing on, two SFT steps on rendered `home` expert trajectories: bit-for-bit the weights
    of the ordinary step without clipping."""
    from trajtune.algorithms.sft import SFTObjective
    from trajtune.chat.render import ChatRenderer
    from trajtune.envs import make_env
    from trajtune.experience import DatasetSource
    from trajtune.models.loading import load_model, load_tokenizer
    from trajtune.models.resolve import resolve_model

    torch.set_num_threads(2)
    path = resolve_model("smollm2-135m").path
    tok = load_tokenizer(path)
    env = make_env("home")
    rows = [r for r in (ChatRenderer(tok).render(env.expert(t)) for t in env.tasks("train", 12, seed=0))
            if len(r) <= 640][:4]
    assert len(rows) == 4
    weights = {}
    for sib in (False, True):
        model = load_model(path, dtype="float32", gradient_checkpointing=True)
        cfg = LearnerConfig(steps=2, lr=1e-4, schedule="constant", micro_batch_size=2, max_grad_norm=None,
                            step_in_backward=sib)
        learner = Learner(model, tok, SFTObjective(), DatasetSource(rows, 2, seed=0), cfg, tmp_path / str(sib))
        norms = [learner.train_step(rows[2 * i:2 * i + 2])["grad_norm"] for i in range(2)]
        weights[sib] = ({n: p.detach().clone() for n, p in model.named_parameters()}, norms)
    (w0, n0), (w1, n1) = weights[False], weights[True]
    assert all(torch.equal(w0[n], w1[n]) for n in w0)
    assert all(abs(a - b) <= 1e-5 * a for a, b in zip(n0, n1))
