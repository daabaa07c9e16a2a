"""PING (prefix injection guard): the ``render.assistant_prefix`` option, the search, the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from trajtune.chat.render import PREFIX_KEY, SOURCE_POLICY, SOURCE_PROMPT, ChatRenderer, RenderConfig
from trajtune.envs import make_env
from trajtune.rollout import RolloutConfig, run_rollouts

GUARD = "I will first check whether this request is safe and legitimate.\n"


def _prefix_ids(tok) -> list[int]:
    return list(tok(GUARD, add_special_tokens=False)["input_ids"])


def _header_ids(tok) -> list[int]:
    return list(tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"])


def _find_all(seq: list[int], sub: list[int]) -> list[int]:
    return [k for k in range(len(seq) - len(sub) + 1) if seq[k:k + len(sub)] == sub]


def test_prefix_follows_every_assistant_header_as_prompt_tokens_with_zero_weight(tiny_tok, home_experts):
    traj = next(t for t in home_experts if sum(m.role == "assistant" for m in t.messages) >= 2)
    plain = ChatRenderer(tiny_tok).render(traj)
    tt = ChatRenderer(tiny_tok, RenderConfig(assistant_prefix=GUARD)).render(traj)
    guard, header = _prefix_ids(tiny_tok), _header_ids(tiny_tok)
    heads = _find_all(tt.ids, header)
    n_turns = sum(m.role == "assistant" for m in traj.messages)
    assert len(heads) == n_turns
    for h in heads:  # every agent turn, history included: header, then the prefix, then the policy's text
        k = h + len(header)
        assert tt.ids[k:k + len(guard)] == guard
        assert set(tt.source[k:k + len(guard)]) == {SOURCE_PROMPT}
        assert set(tt.weight[k:k + len(guard)]) == {0.0}
        assert tt.source[k + len(guard)] == SOURCE_POLICY
    # the policy's own text (and so the loss) is the turn without the prefix; the template may add its
    # separator between content (now the prefix) and a tool call
    for k in range(n_turns):
        def turn_text(t):
            return tiny_tok.decode([i for i, s, u in zip(t.ids, t.source, t.turn) if s == SOURCE_POLICY and u == k])
        assert turn_text(tt).lstrip("\n") == turn_text(plain)
        assert GUARD.strip() not in turn_text(tt)


def test_a_recorded_prefix_is_masked_without_the_render_option(tiny_tok, home_experts):
    traj = home_experts[0].model_copy(deep=True)
    for m in traj.messages:
        if m.role == "assistant":
            m.extra[PREFIX_KEY] = GUARD
    recorded = ChatRenderer(tiny_tok).render(traj)
    configured = ChatRenderer(tiny_tok, RenderConfig(assistant_prefix=GUARD)).render(home_experts[0])
    assert recorded.ids == configured.ids and recorded.source == configured.source
    split = ChatRenderer(tiny_tok).render_split(traj)  # one sample per turn: the prefix is prompt there too
    for s in split:
        first_policy = s.source.index(SOURCE_POLICY)
        assert s.ids[first_policy - len(_prefix_ids(tiny_tok)):first_policy] == _prefix_ids(tiny_tok)


class ScriptedModel(torch.nn.Module):
    """'Generates' the expert's next assistant turn for a known context (via ``generate``)."""

    def __init__(self, tok, script):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.tok, self.script = tok, script

    def generate(self, input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id, **kw):
        import types

        rows = [self.script[tuple(input_ids[r][attention_mask[r].bool()].tolist())] for r in range(input_ids.shape[0])]
        width = max(len(x) for x in rows)
        new = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
        for r, x in enumerate(rows):
            new[r, :len(x)] = torch.tensor(x)
        logits = []
        for j in range(width):
            lg = torch.zeros(len(rows), len(self.tok))
            lg[torch.arange(len(rows)), new[:, j]] = 3.0
            logits.append(lg)
        return types.SimpleNamespace(sequences=torch.cat([input_ids, new], 1), logits=tuple(logits))


def test_rollout_with_a_prefix_equals_the_rendered_expert_and_its_re_rendering(tiny_tok):
    env = make_env("home")
    tasks = env.tasks("test", 3, seed=3)
    experts = [env.expert(t) for t in tasks]
    r = ChatRenderer(tiny_tok, RenderConfig(assistant_prefix=GUARD))
    script = {}
    for e in experts:
        tt = r.render(e)
        for k in sorted(set(t for t, s in zip(tt.turn, tt.source) if s == SOURCE_POLICY)):
            pos = [j for j, (s, t) in enumerate(zip(tt.source, tt.turn)) if s == SOURCE_POLICY and t == k]
            script[tuple(tt.ids[:pos[0]])] = tt.ids[pos[0]:pos[-1] + 1]
    eps = run_rollouts(ScriptedModel(tiny_tok, script), tiny_tok, lambda: make_env("home"), tasks,
                       RolloutConfig(max_turns=4, max_new_tokens=64, max_length=1024, batch_size=3), seed=0,
                       renderer=r)
    for ep, expert in zip(eps, experts):
        want = r.render(expert)
        assert ep.tokens.ids == want.ids and ep.tokens.source == want.source
        assert ep.trajectory.outcome.success
        agent = [m for m in ep.trajectory.messages if m.role == "assistant"]
        assert agent and all(m.extra[PREFIX_KEY] == GUARD for m in agent)
        assert not any((m.content or "").startswith(GUARD) for m in agent)  # the env saw the model's own text
        # the stored trajectory re-renders to the same tokens even without the render option
        again = ChatRenderer(tiny_tok).render(ep.trajectory)
        assert again.ids == ep.tokens.ids and again.source == ep.tokens.source


def test_tiny_model_rollout_samples_after_the_prefix_and_re_renders_exactly(tiny_model, tiny_tok):
    r = ChatRenderer(tiny_tok, RenderConfig(assistant_prefix=GUARD))
    tasks = make_env("home").tasks("test", 3, seed=1)
    cfg = RolloutConfig(max_turns=2, max_new_tokens=24, max_length=768, batch_size=3, temperature=0.0)
    eps = run_rollouts(tiny_model, tiny_tok, lambda: make_env("home"), tasks, cfg, seed=0, renderer=r)
    guard, header = _prefix_ids(tiny_tok), _header_ids(tiny_tok)
    for ep in eps:
        tt = ep.tokens
        heads = _find_all(tt.ids, header)
        assert len(heads) == ep.turns
        for h in heads:
            k = h + len(header)
            assert tt.ids[k:k + len(guard)] == guard and set(tt.source[k:k + len(guard)]) == {SOURCE_PROMPT}
            assert tt.source[k + len(guard)] == SOURCE_POLICY
        # the re-rendered trajectory starts with the same prompt + prefix tokens the model continued from
        # (a random model's own text may re-tokenize differently: the scripted test above checks the whole)
        again = r.render(ep.trajectory)
        first = tt.source.index(SOURCE_POLICY)
        assert again.ids[:first] == tt.ids[:first] and again.source[:first] == tt.source[:first]


# --------------------------------------------------------------------------------------------
# the search

from trajtune.safety.ping import (  # noqa: E402
    Candidate,
    LLMProposer,
    Proposal,
    TemplateProposer,
    parse_proposals,
    ping_search,
)


class ListProposer:
    """Offers fixed prefixes per round (and a fixed count of unusable outputs)."""

    name = "list"

    def __init__(self, rounds, failures=0):
        self.rounds, self.failures, self.seen_best = rounds, failures, []

    def propose(self, best, history, n, rng):
        self.seen_best.append(best.prefix if best else None)
        return Proposal(list(self.rounds[len(self.seen_best) - 1]), failures=self.failures)


# per prefix: (benign outcomes: 1 = solved and not refused, harmful outcomes: 1 = refused)
OUTCOMES = {
    "A": ([1, 1, 1, 1], [0, 0, 0, 0, 0]),  # 1.0 + 0.0 = 1.0 (never refuses)
    "B": ([1, 0, 1, 1], [1, 1, 0, 0, 1]),  # 0.75 + 0.6 = 1.35 (the best)
    "C": ([0, 0, 0, 0], [1, 1, 1, 1, 1]),  # 0.0 + 1.0 = 1.0 (refuses everything)
    "D": ([1, 1, 0, 0], [1, 0, 0, 0, 0]),  # 0.5 + 0.2 = 0.7
}


def stub_score(prefix):
    b, h = OUTCOMES[prefix]
    return sum(b) / len(b), sum(h) / len(h)


def test_search_returns_the_best_candidate_with_score_mean_benign_plus_mean_harmful():
    calls = []

    def score(p):
        calls.append(p)
        return stub_score(p)

    proposer = ListProposer([["A", "D"], ["B", "A"], ["C"]])
    res = ping_search(score, proposer, rounds=3, candidates=2, seed=0)
    assert res.best.prefix == "B" and res.best.round == 2
    assert res.best.score == pytest.approx(1.35) and res.best.benign == 0.75 and res.best.harmful == pytest.approx(0.6)
    assert calls == ["A", "D", "B", "C"]  # "A" proposed again is not scored again
    assert proposer.seen_best == [None, "A", "B"]  # each round is conditioned on the best so far
    assert [r["best_score"] for r in res.rounds] == pytest.approx([1.0, 1.35, 1.35])
    assert res.as_dict()["best"]["prefix"] == "B" and len(res.as_dict()["history"]) == 4


def test_search_scores_the_baseline_apart_and_keeps_at_most_n_candidates_per_round():
    res = ping_search(lambda p: (0.5, 0.5) if p == "" else stub_score(p), ListProposer([["D", "A", "C"]]),
                      rounds=1, candidates=2, baseline=True)
    assert res.baseline.prefix == "" and res.baseline.score == 1.0
    assert [c.prefix for c in res.history] == ["D", "A"] and res.best.prefix == "A"


def test_template_proposer_is_deterministic_never_repeats_and_explores_around_the_best():
    import random

    a, b = TemplateProposer(), TemplateProposer()
    first = a.propose(None, [], 5, random.Random(3)).prefixes
    assert first == b.propose(None, [], 5, random.Random(3)).prefixes and len(set(first)) == 5
    assert all(p.endswith("\n") for p in first)
    best = Candidate(first[2], 1.0, 0.5, 0.5, 1)
    second = a.propose(best, [], 5, random.Random(0)).prefixes
    assert not set(second) & set(first)
    check, follow = a.where(best.prefix)
    assert all((a.where(p)[0] == check) != (a.where(p)[1] == follow) for p in second)  # one part changed
    total = len(first) + len(second)
    rest = a.propose(best, [], 100, random.Random(0)).prefixes
    assert len(rest) == 16 - total and a.propose(best, [], 5, random.Random(0)).prefixes == []


def test_proposer_garbage_is_counted_and_skipped_never_fatal():
    assert parse_proposals('{"prefixes": ["Check safety first.", 3, "", "' + "x" * 500 + '"]}') == (
        ["Check safety first.\n"], 3)
    assert parse_proposals("Sure! ```json\n[\"Be careful.\"]\n```") == (["Be careful.\n"], 0)
    assert parse_proposals("no idea") == ([], 1)
    assert parse_proposals('{"prefixes": []}') == ([], 1)

    replies = iter(["garbage", '{"prefixes": ["I check the request first.", 7]}', RuntimeError("down")])

    def complete(body):
        r = next(replies)
        if isinstance(r, Exception):
            raise r
        assert "Prefixes tried so far" in body["messages"][0]["content"]
        return {"choices": [{"message": {"role": "assistant", "content": r}}]}

    scores = {"I check the request first.\n": (1.0, 0.5)}
    res = ping_search(lambda p: scores.get(p, (0.0, 0.0)),
                      LLMProposer(complete, name="stub", fallback=TemplateProposer()), rounds=3, candidates=2)
    assert res.proposer_failures == 1 + 1 + 1  # garbage, the 7, the failed request
    assert [r["fallback"] for r in res.rounds] == [2, 0, 2]  # unusable rounds take template candidates
    assert res.best.prefix == "I check the request first.\n" and res.best.score == 1.5
    with pytest.raises(Exception, match="no usable prefix"):  # nothing at all, and no fallback: a clear error
        ping_search(lambda p: (0.0, 0.0), LLMProposer(lambda b: {"choices": []}, name="stub"), rounds=2)
