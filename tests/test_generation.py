"""The cached multi-turn sampler: the same tokens as `generate` re-encoding the whole history,
log-probs equal to a recompute, rows leaving the batch at their own stop, fallback for models it
cannot serve."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gguf_fixtures import tiny_llama
from trajtune.algorithms.batch import collate, token_logprobs
from trajtune.generation import (CachedSampler, RowCache, _fill_from_the_end, _inverse_cdf, _prefill_groups,
                                 _search, shared_prompt_prefix, supports)
from trajtune.rollout import RolloutConfig, _generate
from trajtune.tokens import SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory


TOK = SimpleNamespace(pad_token_id=0)  # all `generate` needs of a tokenizer here


def _varied(model):
    """Large random weights: greedy continuations that vary (a fresh tiny model repeats one token)."""
    import copy

    model = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model.eval()


def _models(tiny_model):
    llama, _ = tiny_llama(seed=1)
    return {"qwen2": _varied(tiny_model), "llama": _varied(llama)}


def _prompts(vocab: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_greedy_turns_from_the_cache_equal_generate_on_the_whole_history(tiny_model, arch):
    model = _models(tiny_model)[arch]
    assert supports(model)
    vocab = model.config.vocab_size
    shared = _prompts(vocab, [10], seed=5)[0]  # a common start (system prompt, tools): encoded once
    seqs = [shared + tail for tail in _prompts(vocab, [7, 12, 3, 12])]
    seqs[3] = list(seqs[1])  # an identical first prompt (a group): encoded once, must still match
    cfg = RolloutConfig(temperature=0.0, max_new_tokens=6)
    # a stop token that row 0 emits early, so rows leave the batch at different steps
    probe = _generate(model, TOK, seqs, [6] * 4, cfg, [vocab - 1], seed=0)
    first = probe[0][0]
    j = next(j for j in range(1, len(first)) if first[j] not in first[:j])
    stop = first[j]
    sampler = CachedSampler(model, 0.0, 1.0, [stop])
    caches = [None] * 4
    history = [list(s) for s in seqs]
    new = [list(s) for s in seqs]
    for turn in range(3):  # turns separated by "observations" of different lengths
        room = [6, 4, 6, 5]
        want = _generate(model, TOK, history, room, cfg, [stop], seed=0)
        got = sampler.turn(list(zip(caches, new)), room, seed=turn)
        if turn == 0:  # row 0 stops after j + 1 tokens while the others go on
            assert got[0][2] and len(got[0][0]) == j + 1 and not all(ended for _, _, ended, _ in got)
        for r, ((ids, lps, ended, cache), (w_ids, w_lps, w_ended)) in enumerate(zip(got, want)):
            assert ids == w_ids and ended == w_ended, (turn, r)
            assert lps == pytest.approx(w_lps, abs=1e-4)
            assert cache.n == len(history[r]) + len(ids) - 1  # every token but the last sampled one
            caches[r] = cache
        obs = _prompts(vocab, [2 + turn, 5, 1, 3], seed=10 + turn)
        for r, (ids, _, _, _) in enumerate(got):
            history[r] += ids + obs[r]
            new[r] = [ids[-1]] + obs[r]


def test_sampled_log_probs_equal_a_recompute_and_top_p_keeps_the_nucleus(tiny_model):
    model = _varied(tiny_model)
    vocab = model.config.vocab_size
    seqs = _prompts(vocab, [9, 4, 15])
    sampler = CachedSampler(model, 0.8, 0.9, [])
    out = sampler.turn([(None, s) for s in seqs], [12, 12, 12], seed=7)
    again = sampler.turn([(None, s) for s in seqs], [12, 12, 12], seed=7)
    assert [o[0] for o in out] == [a[0] for a in again]  # seeded: the same draw
    rows = [TokenTrajectory(ids=s + ids, source=[SOURCE_PROMPT] * len(s) + [SOURCE_POLICY] * len(ids),
                            turn=[0] * (len(s) + len(ids)), weight=[0.0] * len(s) + [1.0] * len(ids),
                            logprobs=[0.0] * len(s) + lps) for s, (ids, lps, _, _) in zip(seqs, out)]
    b = collate(rows, 0)
    lp, _ = token_logprobs(model, b, temperature=0.8)
    m = b.source[:, 1:] == SOURCE_POLICY
    assert float(((lp.detach() - b.old_logprobs[:, 1:]).abs() * m).max()) < 1e-3
    # every sampled token lies in the top-p nucleus of its distribution
    with torch.no_grad():
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits[:, :-1].float()
    probs = torch.softmax(logits / 0.8, -1)
    for r in range(len(rows)):
        for t in m[r].nonzero().squeeze(-1).tolist():
            p = probs[r, t]
            tok = int(b.input_ids[r, t + 1])
            assert float(p[p > p[tok]].sum()) <= 0.9 + 1e-4


def test_one_uniform_per_row_draws_each_token_at_its_probability_and_never_a_cut_one():
    # rows unnormalised on purpose (top-p leaves them so); the second row's cut tokens have mass 0
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.0, 0.5, 0.0, 0.25]])
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([_inverse_cdf(probs, gen) for _ in range(20000)])
    freq0 = torch.bincount(draws[:, 0], minlength=4).double() / 20000
    freq1 = torch.bincount(draws[:, 1], minlength=4).double() / 20000
    # 4 standard errors of a frequency near 0.5 over 20000 draws: 0.014
    assert torch.allclose(freq0, torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64), atol=0.014)
    assert torch.allclose(freq1, torch.tensor([0.0, 2 / 3, 0.0, 1 / 3], dtype=torch.float64), atol=0.014)
    assert freq1[0] == 0 and freq1[2] == 0  # exactly: a zero-mass token is never drawn
    # the edges of the uniform: 0 draws the first token with mass, just below 1 the last one
    cdf = probs[1:].double().cumsum(-1)
    assert int(torch.searchsorted(cdf, torch.zeros(1, 1, dtype=torch.float64), right=True)) == 1
    assert int(torch.searchsorted(cdf, cdf[:, -1:] * (1 - 1e-12), right=True)) == 3


@pytest.mark.parametrize("block", [1, 2, 3, 256])
def test_the_two_level_search_draws_what_one_search_over_the_whole_row_draws(block):
    # blocks of 1 token, of 2 (the row splits evenly), of 3 and 256 (the row is padded with zeros);
    # every third token cut to zero mass, as top-p leaves them, the last one among them
    g = torch.Generator().manual_seed(5)
    probs = torch.rand(64, 1000, generator=g, dtype=torch.float64).float()
    probs[:, ::3] = 0.0
    probs[:, -1] = 0.0
    cdf = probs.double().cumsum(-1)
    draws, want = [], []
    for seed in range(20):
        draws.append(_inverse_cdf(probs, torch.Generator().manual_seed(seed), block=block))
        u = torch.rand((64, 1), generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * cdf[:, -1:]
        want.append(torch.searchsorted(cdf, u, right=True).squeeze(-1))
    draws, want = torch.cat(draws), torch.cat(want)
    assert torch.equal(draws, want)
    assert bool((probs.flatten()[draws + 1000 * torch.arange(64).repeat(20)] > 0).all())
    # the uniform's edges, and a block boundary: the draw is the first token with mass past it, never
    # one of the zero-mass tokens that end a block
    row = torch.tensor([[0.0, 0.25, 0.0, 0.5, 0.25, 0.0]])
    top = torch.nextafter(torch.tensor(1.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64))
    for u, tok in [(0.0, 1), (0.25, 3), (0.75, 4), (float(top), 4)]:
        assert int(_search(row, torch.tensor([[u]], dtype=torch.float64), 3)) == tok


def test_rows_leaving_the_batch_are_replaced_by_rows_from_its_end():
    # 6 rows, 1 and 4 leave: row 5 (beyond the 4 kept slots) moves into slot 1; 4's slot is dropped
    assert _fill_from_the_end([0, 2, 3, 5], 6) == ([0, 5, 2, 3], [(1, 5)])
    # the last rows leave: nothing moves
    assert _fill_from_the_end([0, 1, 2], 5) == ([0, 1, 2], [])
    # the first rows leave: the last ones fill them, in order
    assert _fill_from_the_end([2, 3, 4], 5) == ([3, 4, 2], [(0, 3), (1, 4)])


def test_models_with_sliding_or_hybrid_layers_fall_back_to_generate():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=8, sliding_window=4,
                           layer_types=["sliding_attention", "full_attention"])
    assert not supports(Gemma3ForCausalLM(cfg))


def test_rollouts_refill_free_places_and_keep_task_order(tiny_model, tiny_tok):
    from trajtune.chat.render import ChatRenderer
    from trajtune.envs import make_env
    from trajtune.rollout import run_rollouts

    tasks = make_env("home").tasks("test", 5, seed=0)
    r = ChatRenderer(tiny_tok)
    out = {}
    for bs in (2, 5):
        calls = []
        ro = RolloutConfig(max_turns=2, max_new_tokens=8, max_length=1024, temperature=0.0, batch_size=bs)
        eps = run_rollouts(tiny_model, tiny_tok, lambda: make_env("home"), tasks, ro, renderer=r,
                           progress=calls.append)
        assert [e.task.id for e in eps] == [t.id for t in tasks] and calls == [1] * 5
        out[bs] = eps
    # greedy: an episode does not depend on which others share its batch
    assert [e.tokens.ids for e in out[2]] == [e.tokens.ids for e in out[5]]


def test_a_shared_prompt_start_and_identical_prompts_are_encoded_once(tiny_model):
    model = _varied(tiny_model)
    calls = []
    hook = model.register_forward_pre_hook(lambda m, args, kw: calls.append(tuple(kw["input_ids"].shape)),
                                           with_kwargs=True)
    shared = list(range(3, 23))
    rows = [(None, shared + [30 + i] * (i + 1)) for i in range(4)] + [(None, shared + [30])]  # the last repeats row 0
    out = CachedSampler(model, 0.0, 1.0, []).turn(rows, [1] * 5, seed=0)
    hook.remove()
    assert calls == [(1, 20), (4, 4)]  # the 20 shared tokens once, then the 4 distinct tails (1-4 tokens)
    assert out[4][0] == out[0][0] and [o[3].n for o in out] == [21, 22, 23, 24, 21]


def test_prefill_passes_group_rows_of_similar_length_under_the_token_budget():
    items = [(None, [1] * n) for n in (5, 100, 3, 60, 200, 7)]
    # sorted by length 3, 5, 7 | 60 | 100 | 200: 3 rows x 7 = 21 fit 128; 60 x 2 = 120 would, but
    # 4 x 60 (the 60 joining 3, 5, 7) does not; 100 x 2 and 200 do not either
    assert _prefill_groups(items, 128) == [[2, 0, 5], [3], [1], [4]]
    assert _prefill_groups(items, 1) == [[2], [0], [5], [3], [1], [4]]
    assert _prefill_groups(items, 10**9) == [[2, 0, 5, 3, 1, 4]]
    cached = RowCache([], 50)  # equal new lengths: the shorter cache first
    assert _prefill_groups([(cached, [1, 2]), (None, [3, 4])], 100) == [[1, 0]]


def test_the_pass_budget_is_narrow_on_a_cpu_and_wide_on_an_accelerator(tiny_model):
    import copy

    from trajtune import generation

    assert CachedSampler(tiny_model, 0.0, 1.0, []).prefill_tokens == generation.PREFILL_TOKENS
    off_cpu = copy.deepcopy(tiny_model).to("meta")  # any device but the CPU
    assert CachedSampler(off_cpu, 0.0, 1.0, []).prefill_tokens == generation.PREFILL_TOKENS_ACCELERATOR
    assert generation.PREFILL_TOKENS_ACCELERATOR > 32 * 835  # 32 long prompts in one pass


def test_prefill_in_several_passes_gives_the_turns_of_one_pass(tiny_model):
    model = _varied(tiny_model)
    vocab = model.config.vocab_size
    seqs = _prompts(vocab, [30, 4, 17, 9, 25], seed=3)
    calls = []
    hook = model.register_forward_pre_hook(
        lambda m, args, kw: calls.append(tuple(kw["input_ids"].shape)) if kw["input_ids"].shape[1] > 1 else None,
        with_kwargs=True)
    one, split = CachedSampler(model, 0.0, 1.0, []), CachedSampler(model, 0.0, 1.0, [])
    one.prefill_tokens, split.prefill_tokens = 10**9, 20
    outs = {}
    for name, sampler in (("one", one), ("split", split)):
        calls.clear()
        first = sampler.turn([(None, s) for s in seqs], [5] * 5, seed=0)
        obs = _prompts(vocab, [3, 8, 1, 6, 2], seed=4)
        nxt = sampler.turn([(c, [ids[-1]] + o) for (ids, _, _, c), o in zip(first, obs)], [5] * 5, seed=1)
        outs[name] = (first, nxt, list(calls))
    hook.remove()
    # one pass per turn, against passes of at most 20 padded tokens: 4, 9 | 17 | 25 | 30 new tokens,
    # then 2, 3, 4 | 7, 9 (the sampled token and an observation)
    assert outs["one"][2] == [(5, 30), (5, 9)]
    assert outs["split"][2] == [(2, 9), (1, 17), (1, 25), (1, 30), (3, 4), (2, 9)]
    for turn in (0, 1):
        for (ids, lps, ended, cache), (w_ids, w_lps, w_ended, w_cache) in zip(outs["split"][turn], outs["one"][turn]):
            assert ids == w_ids and ended == w_ended and cache.n == w_cache.n
            assert lps == pytest.approx(w_lps, abs=1e-4)
            for (k, v), (wk, wv) in zip(cache.layers, w_cache.layers):
                assert torch.allclose(k, wk, atol=1e-4) and torch.allclose(v, wv, atol=1e-4)


def test_the_prefix_a_first_turn_encodes_once():
    tools = list(range(100, 112))  # 12 tokens every prompt starts with
    assert shared_prompt_prefix([tools + [1, 2], tools + [3], tools + [1, 4]]) == 12
    # one prompt is the prefix itself: it keeps its last token to predict from
    assert shared_prompt_prefix([tools, tools + [5, 6]]) == 11
    # under 8 shared tokens: not worth a pass of its own
    assert shared_prompt_prefix([tools[:7] + [1], tools[:7] + [2]]) == 0
    assert shared_prompt_prefix([[1, 2, 3], [4, 5, 6]]) == 0
