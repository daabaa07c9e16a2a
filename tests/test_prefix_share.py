"""Shared-prefix training (``trajtune.algorithms.prefix_share``): loss and every parameter's gradient
with sharing on equal the plain forward's within 1e-9 in float64, and what cannot share falls back.

The models are tiny float64 Qwen2 / Llama / Qwen3 decoders (tests/decoder_fixtures.py, which says why
their RMSNorm is swapped for a float64 one)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from trajtune.algorithms import prefix_share as ps
from trajtune.algorithms.batch import collate, token_logprobs
from trajtune.algorithms.dpo import DPOObjective
from trajtune.algorithms.policy_gradient import PolicyGradientObjective
from trajtune.tokens import SOURCE_POLICY, SOURCE_PROMPT

from decoder_fixtures import (checkpointing, episode, float64_norms, gpt2, grpo_group, lora, make_model, multi_turn,
                              rand_ids)

torch.set_num_threads(1)
TOL = 1e-9


@pytest.fixture(autouse=True)
def float64(monkeypatch):
    float64_norms(monkeypatch)
    monkeypatch.setattr(ps, "_told", set())


def loss_and_grads(model, objective, tts, share: bool):
    model.zero_grad(set_to_none=True)
    batch = collate(tts, 0, share_prefix=share)
    loss, _ = objective.loss_sum(model, batch)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads


def count_calls(model):
    calls: list[tuple[int, ...]] = []
    handle = model.register_forward_pre_hook(lambda m, a, kw: calls.append(tuple(kw["input_ids"].shape)),
                                             with_kwargs=True)
    return calls, handle


def assert_same(model, objective, tts, expect_calls: int | None = None):
    loss0, g0 = loss_and_grads(model, objective, tts, share=False)
    calls, h = count_calls(model)
    try:
        loss1, g1 = loss_and_grads(model, objective, tts, share=True)
    finally:
        h.remove()
    assert abs(loss0 - loss1) <= TOL * max(1.0, abs(loss0))
    assert g0.keys() == g1.keys() and g0
    for n in g0:
        assert float((g0[n] - g1[n]).abs().max()) <= TOL, n
    if expect_calls is not None:
        assert len(calls) == expect_calls, calls
    return calls


PG = PolicyGradientObjective(clip_low=0.2, clip_high=0.28, kl_coef=0.0, temperature=0.9)


# -- which rows share ---------------------------------------------------------------------------------

def test_groups_are_found_from_the_tokens_and_capped_below_every_member():
    p = list(range(100, 130))
    seqs = [p + [1, 2], [7] * 40, p + [1, 2, 3, 4], p[:17] + [9] * 5, p]
    # rows 0, 2 and 4 share 29 tokens (row 4 is p alone, 30 tokens: it keeps one of its own), saving
    # 2 × 29; taking row 3 in too would share 17 tokens and save only 3 × 17
    assert ps.find_groups(seqs) == [([0, 2, 4], 29)]
    seqs[3] = p[:20] + [9] * 5  # now 3 × 20 > 2 × 29
    assert ps.find_groups(seqs) == [([0, 2, 3, 4], 20)]
    assert ps.find_groups([p[:10] + [1], p[:10] + [2]]) == []  # below MIN_PREFIX
    assert ps.find_groups([[5] * 40]) == []


def test_two_tasks_form_two_groups_not_one_with_their_short_common_system_prompt():
    system = list(range(200, 220))
    a, b = system + list(range(300, 340)), system + list(range(400, 440))
    seqs = [a + [1], b + [1], a + [2, 2], b + [2, 3], a + [3]]
    assert ps.find_groups(seqs) == [([0, 2, 4], 60), ([1, 3], 60)]


# -- exactness --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["qwen2", "llama", "qwen3"])
@pytest.mark.parametrize("gc", [False, True])
def test_grpo_group_full_weights(kind, gc):
    model = make_model(kind)
    if gc:
        checkpointing(model)
    tts = grpo_group(torch.Generator().manual_seed(0))
    calls = assert_same(model, PG, tts, expect_calls=2)
    assert calls[0] == (1, 40) and calls[1][0] == 4  # the prompt once, then the four completions


@pytest.mark.parametrize("gc", [False, True])
def test_grpo_group_lora(gc):
    model = lora(make_model("qwen2"))
    if gc:
        checkpointing(model)
    assert_same(model, PG, grpo_group(torch.Generator().manual_seed(1)), expect_calls=2)


def test_kl_and_sequence_mean_aggregation_through_the_objective():
    model = make_model("qwen2")
    tts = grpo_group(torch.Generator().manual_seed(2))
    for t in tts:
        t.meta["ref_logprobs"] = [x - 0.1 for x in t.logprobs]
    obj = PolicyGradientObjective(kl_coef=0.05, aggregation="seq_mean_token_mean")
    assert_same(model, obj, tts, expect_calls=2)


def test_dpo_pair():
    model = make_model("llama")
    g = torch.Generator().manual_seed(3)
    prompt = rand_ids(g, 33)
    pair = [episode([(prompt, SOURCE_PROMPT), (rand_ids(g, n), SOURCE_POLICY)], 0.0, "pair", seed=k)
            for k, n in enumerate((7, 12))]
    assert_same(model, DPOObjective(beta=0.2, reference="sampling"), pair, expect_calls=2)


@pytest.mark.parametrize("gc", [False, True])
def test_multi_turn_episodes_whose_common_prefix_ends_mid_way(gc):
    model = make_model("qwen2")
    if gc:
        checkpointing(model)
    tts = multi_turn(torch.Generator().manual_seed(4))
    b = collate(tts, 0)
    seqs = [r[:n] for r, n in zip(b.input_ids.tolist(), b.attention_mask.sum(1).tolist())]
    (rows, p), = ps.find_groups(seqs)
    assert rows == [0, 1, 2] and p == 24 + 6 + 8 + 3  # past the first action: its logits come from the prefix pass
    assert_same(model, PG, tts, expect_calls=2)


def test_rows_without_a_common_prefix_take_the_plain_path_bit_for_bit():
    model = make_model("qwen2")
    g = torch.Generator().manual_seed(5)
    tts = [episode([(rand_ids(g, 30), SOURCE_PROMPT), (rand_ids(g, n), SOURCE_POLICY)], 1.0, seed=n) for n in (4, 9, 6)]
    calls, h = count_calls(model)
    try:
        plain, _ = token_logprobs(model, collate(tts, 0))
        shared, _ = token_logprobs(model, collate(tts, 0, share_prefix=True))
    finally:
        h.remove()
    assert calls == [(3, 39), (3, 39)] and torch.equal(plain, shared)


def test_a_batch_mixing_two_groups_and_a_loner():
    model = make_model("qwen2")
    g = torch.Generator().manual_seed(6)
    a = grpo_group(g, 36, (4, 9), "a", 0)
    b = grpo_group(g, 28, (6, 2, 13), "b", 10)
    loner = [episode([(rand_ids(g, 20), SOURCE_PROMPT), (rand_ids(g, 5), SOURCE_POLICY)], 0.7, "c", seed=30)]
    tts = [a[0], b[0], *loner, a[1], b[1], b[2]]  # interleaved: groups are found, not assumed adjacent
    calls = assert_same(model, PG, tts, expect_calls=5)  # 2 per group + 1 plain for the loner
    assert (1, 25) in calls


def test_micro_batches_through_the_learner(tmp_path):
    """The learner's step (micro_batch_size 3 over two groups of 4: groups split across micro-batches)
    gets the same loss and gradients with train.share_prefix on and off."""
    from trajtune.learner import Learner, LearnerConfig

    g = torch.Generator().manual_seed(7)
    tts = grpo_group(g, 40, (5, 11, 3, 17), "a", 0) + grpo_group(g, 30, (8, 2, 6, 9), "b", 10)
    out = {}
    for share in (False, True):
        model = make_model("qwen2")
        cfg = LearnerConfig(steps=1, lr=1e-3, micro_batch_size=3, max_grad_norm=1e9, schedule="constant",
                            share_prefix=share)
        learner = Learner(model, SimpleNamespace(pad_token_id=0), PG, SimpleNamespace(), cfg, tmp_path / str(share))
        grads: dict[str, torch.Tensor] = {}
        step = learner.optimizer.step

        def capture(*a, **k):
            grads.update({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
            return step(*a, **k)

        learner.optimizer.step = capture
        calls, h = count_calls(model)
        metrics = learner.train_step([t for t in tts])
        h.remove()
        out[share] = (metrics["loss"], grads)
        # micro-batches [a a a] [a b b] [b b]: plain, one forward each; shared, a prefix and a suffix pass
        # per group, and the second micro-batch's lone a row on its own
        assert [c[0] for c in calls] == ([3, 3, 2] if not share else [1, 3, 1, 2, 1, 1, 2]), calls
    (l0, g0), (l1, g1) = out[False], out[True]
    assert abs(l0 - l1) <= TOL and g0.keys() == g1.keys() and g0
    for n in g0:
        assert float((g0[n] - g1[n]).abs().max()) <= TOL, n


# -- what cannot share ------------------------------------------------------------------------------

@pytest.mark.parametrize("make,reason", [
    (lambda: make_model("qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=0), "sliding"),
    (gpt2, "gpt2"),
])
def test_unsupported_models_fall_back_with_identical_results_and_one_log_line(make, reason, caplog):
    model = make()
    tts = grpo_group(torch.Generator().manual_seed(8))
    with caplog.at_level(logging.INFO, logger="trajtune.prefix_share"):
        for _ in range(2):
            l0, g0 = loss_and_grads(model, PG, tts, share=False)
            l1, g1 = loss_and_grads(model, PG, tts, share=True)
            assert l0 == l1 and all(torch.equal(g0[n], g1[n]) for n in g0)
    lines = [r.getMessage() for r in caplog.records if r.name == "trajtune.prefix_share"]
    assert len(lines) == 1 and reason in lines[0] and "plain forward" in lines[0]


def test_reentrant_checkpointing_falls_back():
    model = make_model("qwen2")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True}) \
        if not hasattr(model, "activation_checkpointing_enable") \
        else model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    assert ps.unsupported_reason(model) == "reentrant gradient checkpointing"
    model.eval()  # no checkpointing outside training: sharing applies again
    assert ps.unsupported_reason(model) is None


def test_return_logits_is_the_plain_full_forward():
    model = make_model("qwen2")
    tts = grpo_group(torch.Generator().manual_seed(9))
    a, la = token_logprobs(model, collate(tts, 0), return_logits=True)
    b, lb = token_logprobs(model, collate(tts, 0, share_prefix=True), return_logits=True)
    assert torch.equal(a, b) and torch.equal(la, lb)


def test_the_config_key_reaches_the_learner():
    from trajtune.config import TrainSpec

    assert TrainSpec().share_prefix is True
    assert TrainSpec(share_prefix=False).share_prefix is False
    assert "share_prefix" in TrainSpec.model_fields and TrainSpec.model_fields["share_prefix"].description
