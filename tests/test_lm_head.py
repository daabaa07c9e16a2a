"""The chunked LM head (``trajtune.algorithms.lm_head``, ``train.loss_chunk_tokens``): SFT (with EAFT),
the policy-gradient objective, DPO and the value head give the same loss, metrics and every
parameter's gradient as the unchunked computation within 1e-9 in float64, with and without shared
prefixes, LoRA (on the LM head too) or full weights, gradient checkpointing on or off; the head
never sees more than one chunk of positions; what cannot be split falls back with one log line.

The reference is ``loss_chunk_tokens: 0``: the model's own forward computes all kept logits at
once, as before chunking existed. The models are tests/decoder_fixtures.py's float64 decoders."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest
import torch

from trajtune.algorithms import lm_head
from trajtune.algorithms.batch import collate, token_logprobs
from trajtune.algorithms.dpo import DPOObjective
from trajtune.algorithms.policy_gradient import PolicyGradientObjective
from trajtune.algorithms.sft import SFTObjective
from trajtune.algorithms.value import ValueHead, logprobs_and_values
from trajtune.tokens import SOURCE_POLICY, SOURCE_PROMPT

from decoder_fixtures import V, checkpointing, episode, float64_norms, gpt2, grpo_group, lora, make_model, multi_turn
from decoder_fixtures import rand_ids
from model_fixtures import FixedLogits

torch.set_num_threads(1)
TOL = 1e-9
PG = PolicyGradientObjective(clip_low=0.2, clip_high=0.28, kl_coef=0.0, temperature=0.9)


@pytest.fixture(autouse=True)
def float64(monkeypatch):
    float64_norms(monkeypatch)
    monkeypatch.setattr(lm_head, "_told", set())


def build(kind: str = "qwen2", adapter: str = "full", gc: bool = False):
    model = make_model(kind)
    if adapter == "lora":
        model = lora(model)
    elif adapter == "lora_head":  # a LoRA layer on the LM head itself: the chunks must call it, not its weight
        model = lora(model, ("q_proj", "v_proj", "lm_head"))
    return checkpointing(model) if gc else model


def head_rows(model) -> tuple[list[int], object]:
    """Positions per call of the LM head that produced logits (the capture call returns hidden states)."""
    rows: list[int] = []

    def hook(module, args, out):
        if out.shape[-1] == V:
            rows.append(math.prod(out.shape[:-1]))

    return rows, model.get_output_embeddings().register_forward_hook(hook)


def run(model, objective, tts, chunk, share=False):
    model.zero_grad(set_to_none=True)
    loss, metrics = objective.loss_sum(model, collate(tts, 0, share_prefix=share, loss_chunk_tokens=chunk))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach()), metrics, grads


def assert_chunked_equals_unchunked(model, objective, tts, chunk=8, share=False, split=True):
    rows, h = head_rows(model)
    try:
        l0, m0, g0 = run(model, objective, tts, 0, share)
        whole = list(rows)
        rows.clear()
        l1, m1, g1 = run(model, objective, tts, chunk, share)
    finally:
        h.remove()
    assert abs(l0 - l1) <= TOL * max(1.0, abs(l0))
    for k, v in m0.items():
        a, b = (v, m1[k]) if isinstance(v, tuple) else ((v,), (m1[k],))
        assert all(abs(x - y) <= TOL * max(1.0, abs(x)) for x, y in zip(a, b)), k
    assert g0.keys() == g1.keys() and g0
    for n in g0:
        assert float((g0[n] - g1[n]).abs().max()) <= TOL, n
    if split:
        assert max(rows) <= chunk < max(whole)  # the full logits never existed at once
        assert min(rows) < chunk  # the last chunk is a partial one: the chunk size does not divide the positions
    return whole, rows


def sft_rows(seed: int = 0):
    """Multi-turn rows of unequal lengths, with weights other than 1 on some trained tokens."""
    tts = multi_turn(torch.Generator().manual_seed(seed))
    for k, t in enumerate(tts):
        t.weight = [w * (0.5 if (i + k) % 3 == 0 else 1.0) for i, w in enumerate(t.weight)]
    return tts


# -- exactness --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["qwen2", "llama"])  # tied and untied embeddings
@pytest.mark.parametrize("adapter", ["full", "lora", "lora_head"])
@pytest.mark.parametrize("gc", [False, True])
@pytest.mark.parametrize("eaft", [False, True])
def test_sft_loss_metrics_and_gradients_equal_the_unchunked_ones(kind, adapter, gc, eaft):
    model = build(kind, adapter, gc)
    assert_chunked_equals_unchunked(model, SFTObjective(eaft=eaft, eaft_top_k=5, eaft_alpha=0.7), sft_rows())


def test_sft_sends_only_trained_positions_through_the_head():
    """The unchunked forward computes logits at every (row, kept position); the chunked one only
    where that row trains the token (the other rows' padding and prompt are skipped), once in the
    forward and once more in the backward."""
    model = build()
    tts = sft_rows()
    whole, rows = assert_chunked_equals_unchunked(model, SFTObjective(), tts, chunk=10)
    mask = collate(tts, 0).loss_mask()
    assert whole == [mask.shape[0] * int(mask.any(0).sum())]
    assert sum(rows) == 2 * int(mask.sum()) and int(mask.sum()) < whole[0]


@pytest.mark.parametrize("adapter", ["full", "lora"])
@pytest.mark.parametrize("gc", [False, True])
@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("data", ["grpo", "multi_turn"])
def test_policy_gradient_equals_the_unchunked_one(adapter, gc, share, data):
    model = build("qwen2", adapter, gc)
    g = torch.Generator().manual_seed(1)
    tts = grpo_group(g) if data == "grpo" else multi_turn(g)
    assert_chunked_equals_unchunked(model, PG, tts, chunk=5, share=share)


@pytest.mark.parametrize("share", [False, True])
def test_kl_to_a_reference_through_the_objective(share):
    model = build("qwen3")
    tts = grpo_group(torch.Generator().manual_seed(2))
    for t in tts:
        t.meta["ref_logprobs"] = [x - 0.1 for x in t.logprobs]
    obj = PolicyGradientObjective(kl_coef=0.05, aggregation="seq_mean_token_mean", temperature=1.3)
    assert_chunked_equals_unchunked(model, obj, tts, chunk=6, share=share)


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("adapter", ["full", "lora_head"])
def test_dpo_equals_the_unchunked_one(share, adapter):
    model = build("llama", adapter)
    g = torch.Generator().manual_seed(3)
    prompt = rand_ids(g, 33)
    pairs = [episode([(prompt, SOURCE_PROMPT), (rand_ids(g, n), SOURCE_POLICY)], 0.0, "pair", seed=k)
             for k, n in enumerate((7, 12, 9, 4))]
    assert_chunked_equals_unchunked(model, DPOObjective(beta=0.2, reference="sampling"), pairs, chunk=5, share=share)


@pytest.mark.parametrize("gc", [False, True])
def test_value_head_logprobs_values_and_gradients_equal_the_unchunked_ones(gc):
    model = build("qwen2", "full", gc)
    head = ValueHead(32)  # float32, as in training: it casts the hidden states itself
    torch.nn.init.normal_(head.linear.weight, 0, 0.1)  # zero-initialised: give it a gradient into the trunk
    tts = grpo_group(torch.Generator().manual_seed(4))
    out = {}
    for chunk in (0, 9):
        model.zero_grad(set_to_none=True)
        head.zero_grad(set_to_none=True)
        b = collate(tts, 0, loss_chunk_tokens=chunk)
        logp, values = logprobs_and_values(model, head, b, temperature=0.8)
        (((logp + values) * b.loss_mask()).sum()).backward()
        out[chunk] = (logp.detach(), values.detach(),
                      {n: p.grad.clone() for n, p in [*model.named_parameters(), *head.named_parameters()]})
    (lp0, v0, g0), (lp1, v1, g1) = out[0], out[9]
    assert float((lp0 - lp1).abs().max()) <= TOL and float((v0 - v1).abs().max()) <= TOL
    for n in g0:
        assert float((g0[n] - g1[n]).abs().max()) <= TOL, n


@pytest.mark.parametrize("share", [False, True])
def test_reference_logprobs_without_gradient_equal_the_unchunked_ones(share):
    model = build("qwen2").eval()
    tts = grpo_group(torch.Generator().manual_seed(5))
    with torch.no_grad():
        a, _ = token_logprobs(model, collate(tts, 0, share_prefix=share, loss_chunk_tokens=0), 0.7)
        b, _ = token_logprobs(model, collate(tts, 0, share_prefix=share, loss_chunk_tokens=3), 0.7)
    assert float((a - b).abs().max()) <= TOL


def test_the_learner_step_is_the_same_with_chunks_on_and_off(tmp_path):
    """Micro-batches through the learner (train.loss_chunk_tokens reaches the collated batches)."""
    from trajtune.learner import Learner, LearnerConfig

    tts = sft_rows(6) + sft_rows(7)
    out = {}
    for chunk in (0, 11):
        model = build("qwen2", gc=True)
        cfg = LearnerConfig(steps=1, lr=1e-3, micro_batch_size=4, max_grad_norm=1e9, schedule="constant",
                            loss_chunk_tokens=chunk)
        learner = Learner(model, SimpleNamespace(pad_token_id=0), SFTObjective(), SimpleNamespace(), cfg,
                          tmp_path / str(chunk))
        rows, h = head_rows(model)
        metrics = learner.train_step(list(tts))
        h.remove()
        out[chunk] = (metrics, {n: p.detach().clone() for n, p in model.named_parameters()}, rows)
    (m0, w0, r0), (m1, w1, r1) = out[0], out[11]
    assert max(r1) <= 11 < max(r0)
    for k in ("loss", "ce", "token_accuracy", "grad_norm"):
        assert abs(m0[k] - m1[k]) <= TOL * max(1.0, abs(m0[k])), k
    for n in w0:
        assert float((w0[n] - w1[n]).abs().max()) <= TOL, n


# -- chunk sizes --------------------------------------------------------------------------------------

def test_auto_chunks_hold_at_most_64_mib_of_float32_logits():
    assert lm_head.chunk_positions("auto", 49152) == 341  # SmolLM2: 341 × 49,152 × 4 B = 63.9 MiB
    assert lm_head.chunk_positions("auto", 10 ** 9) == 1
    assert lm_head.chunk_positions(0, 49152) == 0 and lm_head.chunk_positions(512, 49152) == 512


@pytest.mark.parametrize("objective", [PG, SFTObjective()])
def test_what_fits_in_one_chunk_is_computed_as_without_chunking(objective):
    """auto with a 101-token vocabulary fits every position in one chunk: the model's own forward
    computes the logits, once, as with chunking off (a checkpoint of one chunk would save nothing)."""
    model = build()
    tts = grpo_group(torch.Generator().manual_seed(8))
    rows, h = head_rows(model)
    try:
        a = run(model, objective, tts, 0)
        b = run(model, objective, tts, "auto")
    finally:
        h.remove()
    assert len(rows) == 2 and rows[0] == rows[1]
    assert a[0] == b[0] and all(torch.equal(a[2][n], b[2][n]) for n in a[2])


def test_the_config_key_defaults_to_auto_and_refuses_what_is_not_a_size():
    from trajtune.config import ConfigError, TrainSpec

    assert TrainSpec().loss_chunk_tokens == "auto"
    assert TrainSpec(loss_chunk_tokens=0).loss_chunk_tokens == 0
    assert TrainSpec(loss_chunk_tokens=256).loss_chunk_tokens == 256
    assert TrainSpec.model_fields["loss_chunk_tokens"].description
    for bad in (-1, True, "big", 1.5):
        with pytest.raises((ValueError, ConfigError)):
            TrainSpec(loss_chunk_tokens=bad)


# -- what cannot be split -------------------------------------------------------------------------------

class ScaledLogits(torch.nn.Module):
    """A causal LM whose own forward scales the logits after the head (as Cohere and Granite do)."""

    def __init__(self):
        super().__init__()
        self.inner = build()
        self.config = self.inner.config

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        out.logits = out.logits * 0.5
        return out


@pytest.mark.parametrize("make,reason", [
    (gpt2, "model type 'gpt2'"),
    (ScaledLogits, "a forward other than"),
    (lambda: FixedLogits(torch.randn(4, 56, V, dtype=torch.float64)), "no output embeddings"),
])
def test_models_that_cannot_be_split_keep_their_own_logits_with_one_log_line(make, reason, caplog):
    model = make()
    tts = grpo_group(torch.Generator().manual_seed(9))
    with caplog.at_level(logging.INFO, logger="trajtune.lm_head"):
        for _ in range(2):
            l0, _, g0 = run(model, PG, tts, 0)
            l1, _, g1 = run(model, PG, tts, 3)
            assert l0 == l1 and g0.keys() == g1.keys() and all(torch.equal(g0[n], g1[n]) for n in g0)
    lines = [r.getMessage() for r in caplog.records if r.name == "trajtune.lm_head"]
    assert len(lines) == 1 and reason in lines[0] and "loss_chunk_tokens" in lines[0]


def test_a_split_model_logs_nothing(caplog):
    with caplog.at_level(logging.INFO, logger="trajtune.lm_head"):
        run(build("qwen2", "lora"), PG, grpo_group(torch.Generator().manual_seed(10)), 4)
    assert not [r for r in caplog.records if r.name == "trajtune.lm_head"]
