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
