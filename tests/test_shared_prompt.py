"""Decoding a prompt's samples against one copy of its cache (cascade attention): the attention
equals softmax over [prompt, own tokens] computed directly, the sampler gives what the padded batch
gives (float64), rows leave and move as before, and the setting's refusals."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from test_generation import _models, _prompts
from trajtune import generation, shared_prompt
from trajtune.generation import CachedSampler, RowCache
from trajtune.shared_prompt import PromptGroups, shared_prompt_attention, worth_sharing


def _reference(q, prefixes, group, own_k, own_v, scale):
    """Per row and query head: softmax over the row's prompt keys then its own keys, the plain way."""
    b, heads, _, dim = q.shape
    per_kv = heads // own_k.shape[1]
    out = torch.empty(b, 1, heads, dim, dtype=q.dtype)
    for r in range(b):
        pk, pv = prefixes[group[r]]
        for h in range(heads):
            k = torch.cat([pk[0, h // per_kv], own_k[r, h // per_kv]])
            v = torch.cat([pv[0, h // per_kv], own_v[r, h // per_kv]])
            w = torch.softmax(q[r, h, 0] @ k.T * scale, -1)
            out[r, 0, h] = w @ v
    return out


@pytest.mark.parametrize("fused", [True, False])  # torch's CPU flash kernel, or the plain products (other devices)
def test_the_attention_equals_softmax_over_the_prompt_and_the_own_tokens_in_float64(fused, monkeypatch):
    monkeypatch.setattr(shared_prompt, "FUSED_ON_CPU", fused)
    g = torch.Generator().manual_seed(0)
    dt = torch.float64
    b, heads, kv, dim, t = 5, 6, 2, 8, 3
    q = torch.randn(b, heads, 1, dim, generator=g, dtype=dt) * 3  # large scores: the merge's max matters
    prefixes = [(torch.randn(1, kv, p, dim, generator=g, dtype=dt), torch.randn(1, kv, p, dim, generator=g, dtype=dt))
                for p in (7, 11)]
    group = [0, 1, 0, 1, 1]  # rows of a prompt need not be adjacent (after rows left and others moved)
    own_k, own_v = torch.randn(b, kv, t, dim, generator=g, dtype=dt), torch.randn(b, kv, t, dim, generator=g, dtype=dt)
    groups = PromptGroups([[prefixes[0]], [prefixes[1]]], [torch.tensor([0, 2]), torch.tensor([1, 3, 4])])
    module = SimpleNamespace(layer_idx=0)
    got, _ = shared_prompt_attention(module, q, own_k, own_v, None, scaling=0.3,
                                     trajtune_shared_prompt=groups)
    want = _reference(q, prefixes, group, own_k, own_v, 0.3)
    assert got.shape == (b, 1, heads, dim)
    assert torch.allclose(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("fused", [True, False])
def test_bfloat16_attention_is_computed_in_float32_and_rounded_once(fused, monkeypatch):
    monkeypatch.setattr(shared_prompt, "FUSED_ON_CPU", fused)
    # scores rounded to bfloat16 before the softmax (|score| ~ 20 here: steps of 0.125) would be off by
    # several per cent; computed in float32, only the output's own rounding (2^-8 relative) remains
    g = torch.Generator().manual_seed(1)
    b, heads, kv, dim, t = 4, 4, 2, 16, 5
    q = (torch.randn(b, heads, 1, dim, generator=g) * 3).bfloat16()
    prefix = (torch.randn(1, kv, 9, dim, generator=g).bfloat16(), torch.randn(1, kv, 9, dim, generator=g).bfloat16())
    own_k, own_v = torch.randn(b, kv, t, dim, generator=g).bfloat16(), torch.randn(b, kv, t, dim, generator=g).bfloat16()
    groups = PromptGroups([[prefix]], [torch.arange(b)])
    got, _ = shared_prompt_attention(SimpleNamespace(layer_idx=0), q, own_k, own_v, None, scaling=0.25,
                                     trajtune_shared_prompt=groups)
    want = _reference(q.double(), [tuple(x.double() for x in prefix)], [0] * b, own_k.double(), own_v.double(), 0.25)
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.double(), want, rtol=2 ** -8, atol=2 ** -10)


def test_the_attention_refuses_a_forward_that_lost_the_groups():
    q = torch.zeros(1, 2, 1, 4)
    kv = torch.zeros(1, 1, 2, 4)
    with pytest.raises(RuntimeError, match="did not pass them through"):
        shared_prompt_attention(SimpleNamespace(layer_idx=0), q, kv, kv, None)


def test_sharing_needs_two_rows_per_distinct_cache():
    a, c = RowCache([], 3), RowCache([], 4)
    assert worth_sharing([a, a, c, c]) and worth_sharing([a, a, a, c])
    assert not worth_sharing([a, a, c])  # 2 caches, 3 rows
    assert not worth_sharing([a, c]) and not worth_sharing([a, a, None, None])


def _model(tiny_model, arch):
    if arch != "lora":
        return _models(tiny_model)[arch].double()
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)  # init_lora_weights=False: random A and B, so the adapter changes the attention
    cfg = LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj"], init_lora_weights=False)
    return get_peft_model(_models(tiny_model)["qwen2"], cfg).double().eval()


@pytest.mark.parametrize("arch", ["qwen2", "llama", "lora"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_groups_turn_decoded_against_one_prompt_copy_equals_the_padded_batch(tiny_model, arch, temperature,
                                                                                 monkeypatch):
    model = _model(tiny_model, arch)
    vocab = model.config.vocab_size
    prompts = _prompts(vocab, [9, 14, 5])
    rows = [(None, p) for p in prompts for _ in range(4)]  # 3 groups of 4 samples
    room = [7, 5, 7, 6] * 3
    # a stop token the padded batch draws mid-turn, so rows leave at different steps and others move
    probe = CachedSampler(model, temperature, 1.0, [], share_prompt=False).turn(rows, room, seed=3)
    stop = next(ids[2] for ids, _, _, _ in probe if len(set(ids)) > 2)
    made = []

    class Counting(generation.SharedPromptBatch):
        def __init__(self, *a, **k):
            made.append(1)
            super().__init__(*a, **k)

    monkeypatch.setattr(generation, "SharedPromptBatch", Counting)
    outs = {}
    for share in (False, True):
        sampler = CachedSampler(model, temperature, 1.0, [stop], share_prompt=share)
        first = sampler.turn(rows, room, seed=3)
        # a second turn continues every row from the cache the first returned (distinct now: padded)
        obs = _prompts(vocab, [2, 3, 1, 4] * 3, seed=9)
        second = sampler.turn([(c, [ids[-1]] + o) for (ids, _, _, c), o in zip(first, obs)], [4] * 12, seed=4)
        outs[share] = (first, second)
    assert made == [1]  # the shared layout served the first turn only
    lengths = [len(ids) for ids, _, _, _ in outs[False][0]]
    assert min(lengths) < max(lengths)  # rows did leave at different steps
    for turn in (0, 1):
        for (ids, lps, ended, cache), (s_ids, s_lps, s_ended, s_cache) in zip(outs[False][turn], outs[True][turn]):
            assert s_ids == ids and s_ended == ended
            assert s_lps == pytest.approx(lps, abs=1e-9)
            assert s_cache.n == cache.n
            for (k, v), (sk, sv) in zip(cache.layers, s_cache.layers):
                assert sk.shape == k.shape and torch.allclose(sk, k, atol=1e-9) and torch.allclose(sv, v, atol=1e-9)


def test_the_setting_is_refused_where_it_does_nothing():
    from pydantic import ValidationError

    from trajtune.config import RolloutSpec

    assert RolloutSpec().to_config().share_prompt_cache is True
    assert RolloutSpec(share_prompt_cache=False).to_config().share_prompt_cache is False
    with pytest.raises(ValidationError, match="share_prompt_cache: false does nothing with rollout.reuse_kv_cache"):
        RolloutSpec(reuse_kv_cache=False, share_prompt_cache=False)
    with pytest.raises(ValidationError, match="rollout.share_prompt_cache does nothing with rollout.server"):
        RolloutSpec(server="http://127.0.0.1:1", share_prompt_cache=False)


def test_a_groups_rollouts_decode_against_one_prompt_copy_unless_turned_off(monkeypatch, tiny_model, tiny_tok):
    from trajtune import rollout
    from trajtune.envs.registry import make_env

    made = []

    class Counting(generation.SharedPromptBatch):
        def __init__(self, model, kw, caches, room, config):
            made[-1] = len({id(c) for c in caches}), len(caches)
            super().__init__(model, kw, caches, room, config)

    monkeypatch.setattr(generation, "SharedPromptBatch", Counting)
    task = make_env("fncall", single_turn=True).tasks("train", 1, seed=0)[0]
    for share in (True, False):
        made.append(None)
        cfg = rollout.RolloutConfig(max_turns=1, max_new_tokens=4, share_prompt_cache=share)
        eps = rollout.run_rollouts(tiny_model, tiny_tok, lambda: make_env("fncall", single_turn=True), [task] * 4,
                                  cfg, seed=0)
        assert len(eps) == 4 and all(e.tokens.ids for e in eps)
    assert made == [(1, 4), None]  # a group of 4 samples: one prompt cache, decoded once; off: never


def test_rows_continuing_one_cache_with_the_same_tokens_are_encoded_once_and_share_it(tiny_model):
    model = _models(tiny_model)["qwen2"].double()
    prompt = _prompts(model.config.vocab_size, [12])[0]
    ((_, _, _, cache),) = CachedSampler(model, 0.0, 1.0, []).turn([(None, prompt)], [3], seed=0)
    calls = []
    hook = model.register_forward_pre_hook(lambda m, args, kw: calls.append(tuple(kw["input_ids"].shape)),
                                           with_kwargs=True)
    rows = [(cache, [7, 8])] * 3 + [(cache, [9])] * 3  # two continuations of one saved state, 3 samples each
    got = CachedSampler(model, 1.0, 1.0, []).turn(rows, [4] * 6, seed=1)
    hook.remove()
    assert calls == [(2, 2)] + [(6, 1)] * 3  # 2 distinct continuations in one pass, not 6; then 6 rows decode
    want = CachedSampler(model, 1.0, 1.0, [], share_prompt=False).turn(rows, [4] * 6, seed=1)
    assert [g[0] for g in got] == [w[0] for w in want]
    assert [g[3].n for g in got] == [cache.n + 2 + 3] * 3 + [cache.n + 1 + 3] * 3


def test_a_row_cache_joins_its_prompt_and_own_tokens_only_when_read():
    g = torch.Generator().manual_seed(2)
    prompt = RowCache([(torch.randn(1, 2, 5, 4, generator=g), torch.randn(1, 2, 5, 4, generator=g))], 5)
    own = [(torch.randn(1, 2, 3, 4, generator=g), torch.randn(1, 2, 3, 4, generator=g))]
    row = RowCache.joined_later(prompt, own, 8)
    assert row._layers is None  # nothing copied yet
    ((k, v),) = row.layers
    assert row.n == 8 and k.shape == (1, 2, 8, 4)
    assert torch.equal(k, torch.cat([prompt.layers[0][0], own[0][0]], 2))
    assert torch.equal(v, torch.cat([prompt.layers[0][1], own[0][1]], 2))
    assert row.layers is row.layers  # joined once


def test_a_joined_later_cache_is_copied_into_a_batch_as_its_joined_layers_would_be():
    from trajtune.generation import _right_aligned

    g = torch.Generator().manual_seed(3)

    def kv(t):
        return torch.randn(1, 2, t, 4, generator=g), torch.randn(1, 2, t, 4, generator=g)

    prompt = RowCache([kv(5), kv(5)], 5)  # two layers
    own = [kv(3), kv(3)]
    row = RowCache.joined_later(prompt, own, 8)
    plain = RowCache([kv(6), kv(6)], 6)
    got = _right_aligned([row, None, plain], 9, room=2)
    assert row._layers is None and row.n_layers == 2  # copied from its pieces, never joined
    want = _right_aligned([RowCache(row.layers, 8), None, plain], 9, room=2)
    for (k, v), (wk, wv) in zip(got, want):
        assert k.shape == (3, 2, 11, 4) and torch.equal(k, wk) and torch.equal(v, wv)
    # row 0 ends at position 9: the prompt's 5 tokens, then its own 3 (layer 1's keys)
    assert torch.equal(got[1][0][0, :, 1:6], prompt.layers[1][0][0])
    assert torch.equal(got[1][0][0, :, 6:9], own[1][0][0]) and not got[1][0][0, :, 0].any()
