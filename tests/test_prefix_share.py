"""Shared-prefix training (``trajtune.algorithms.prefix_share``): loss and every parameter's gradient
with sharing on equal the plain forward's within 1e-9 in float64, and what cannot share falls back.

The models are tiny Qwen2 / Llama decoders made here in float64. Their RMSNorm computes in float32
(transformers upcasts half-precision inputs that way), which would round every gradient through it
to float32 and hide the comparison under ~1e-7 of summation-order noise; the fixture swaps it for
the same formula in the input's dtype, so the whole model is float64 and 1e-9 is meaningful."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from trajtune.algorithms import prefix_share as ps
from trajtune.algorithms.batch import collate, token_logprobs
from trajtune.algorithms.dpo import DPOObjective
from trajtune.algorithms.policy_gradient import PolicyGradientObjective
from trajtune.tokens import SOURCE_ENV, SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory

torch.set_num_threads(1)
V = 101
TOL = 1e-9


def _rmsnorm_in_input_dtype(self, h):
    return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


@pytest.fixture(autouse=True)
def float64_norms(monkeypatch):
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen2 import modeling_qwen2
    from transformers.models.qwen3 import modeling_qwen3

    monkeypatch.setattr(modeling_qwen2.Qwen2RMSNorm, "forward", _rmsnorm_in_input_dtype)
    monkeypatch.setattr(modeling_qwen3.Qwen3RMSNorm, "forward", _rmsnorm_in_input_dtype)
    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", _rmsnorm_in_input_dtype)
    monkeypatch.setattr(ps, "_told", set())


def make_model(kind: str = "qwen2", **cfg):
    from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                              Qwen3ForCausalLM)

    shape = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, **cfg)
    torch.manual_seed(0)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**shape))
    elif kind == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=8, **shape))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **shape))
    return model.double().train()


def lora(model):
    from peft import LoraConfig, get_peft_model

    m = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                         task_type="CAUSAL_LM"))
    torch.manual_seed(1)
    for n, p in m.named_parameters():  # B starts at 0: give the adapter a non-zero effect
        if "lora_B" in n:
            p.data.normal_(0, 0.1)
    return m.train()


def checkpointing(model):
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _rand(g, n):
    return torch.randint(3, V, (n,), generator=g).tolist()


def episode(ids_src: list[tuple[list[int], int]], adv: float, group: str = "", seed: int = 0) -> TokenTrajectory:
    ids = [i for part, _ in ids_src for i in part]
    src = [s for part, s in ids_src for _ in part]
    g = torch.Generator().manual_seed(seed)
    lp = [float(-torch.rand(1, generator=g)) if s == SOURCE_POLICY else 0.0 for s in src]
    return TokenTrajectory(ids=ids, source=src, turn=[0] * len(ids), weight=[1.0] * len(ids), logprobs=lp,
                           advantages=[adv if s == SOURCE_POLICY else 0.0 for s in src], group=group)


def grpo_group(g, prompt_len=40, lengths=(5, 11, 3, 17), group="g0", offset=0):
    prompt = _rand(g, prompt_len)
    return [episode([(prompt, SOURCE_PROMPT), (_rand(g, n), SOURCE_POLICY)], (-1) ** k * (0.5 + k), group,
                    seed=offset + k) for k, n in enumerate(lengths)]


def multi_turn(g):
    """Episodes of one task: a shared prompt, first action and observation, then they diverge (the
    common prefix ends inside the second turn, after policy tokens)."""
    prompt, act, obs = _rand(g, 24), _rand(g, 6), _rand(g, 8)
    out = []
    for k, (n_act, n_obs, n_last) in enumerate([(4, 7, 3), (9, 2, 6), (2, 5, 12)]):
        shared_start = [3, 4, 5]  # the second action starts alike in every episode
        out.append(episode([(prompt, SOURCE_PROMPT), (act, SOURCE_POLICY), (obs, SOURCE_ENV),
                            (shared_start + _rand(g, n_act), SOURCE_POLICY), (_rand(g, n_obs), SOURCE_ENV),
                            (_rand(g, n_last), SOURCE_POLICY)], 0.3 * (k - 1), "mt", seed=10 + k))
    return out


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
    prompt = _rand(g, 33)
    pair = [episode([(prompt, SOURCE_PROMPT), (_rand(g, n), SOURCE_POLICY)], 0.0, "pair", seed=k)
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
    tts = [episode([(_rand(g, 30), SOURCE_PROMPT), (_rand(g, n), SOURCE_POLICY)], 1.0, seed=n) for n in (4, 9, 6)]
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
    loner = [episode([(_rand(g, 20), SOURCE_PROMPT), (_rand(g, 5), SOURCE_POLICY)], 0.7, "c", seed=30)]
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

def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=256, bos_token_id=0,
                                      eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).double().train()


@pytest.mark.parametrize("make,reason", [
    (lambda: make_model("qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=0), "sliding"),
    (_gpt2, "gpt2"),
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
