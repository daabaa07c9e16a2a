"""Provenance and no-drift contracts (docs/architecture.md, contracts 1-3) on the tiny template and live rollouts."""

from __future__ import annotations

import types

import pytest
import torch

from trajtune.chat.render import SOURCE_ENV, SOURCE_POLICY, SOURCE_PROMPT, ChatRenderer, RenderError
from trajtune.envs import make_env
from trajtune.rollout import RolloutConfig, run_rollouts
from trajtune.schema import Message, Trajectory


def _assistant_text(tok, msg) -> str:
    """What the tiny template renders for one assistant turn, rebuilt by hand (independent of the renderer)."""
    import json

    parts = [msg.content or ""]
    for k, c in enumerate(msg.tool_calls or []):
        sep = "\n" if (msg.content or k > 0) else ""
        parts.append(sep + "<tool_call>" + json.dumps({"name": c.name, "arguments": c.arguments},
                                                      ensure_ascii=False) + "</tool_call>")
    return "".join(parts) + "<|im_end|>"


def test_policy_tokens_are_exactly_the_assistant_turns(tiny_tok, home_experts):
    r = ChatRenderer(tiny_tok)
    for traj in home_experts[:10]:
        tt = r.render(traj)
        turns = sorted(set(t for t, s in zip(tt.turn, tt.source) if s == SOURCE_POLICY))
        assistants = [m for m in traj.messages if m.role == "assistant"]
        assert len(turns) == len(assistants)
        for k, m in zip(turns, assistants):
            ids = [i for i, s, t in zip(tt.ids, tt.source, tt.turn) if s == SOURCE_POLICY and t == k]
            assert tiny_tok.decode(ids) == _assistant_text(tiny_tok, m)
        # everything else is prompt or environment, and the whole decodes to the template's text
        full = tiny_tok.apply_chat_template(
            [__import__("trajtune.chat.render", fromlist=["x"]).message_to_template_dict(m) for m in traj.messages],
            tools=[t.to_openai() for t in traj.tools], tokenize=False)
        assert tiny_tok.decode(tt.ids) == full.rstrip("\n")
        assert tt.source[0] == SOURCE_PROMPT and SOURCE_ENV in tt.source
        assert all((w > 0) == (s == SOURCE_POLICY) for w, s in zip(tt.weight, tt.source))


def test_train_hint_and_last_turn_weights(tiny_tok, home_experts):
    from trajtune.chat.render import RenderConfig

    traj = home_experts[1].model_copy(deep=True)
    first = next(m for m in traj.messages if m.role == "assistant")
    first.train = False
    tt = ChatRenderer(tiny_tok, RenderConfig(train_on="hint")).render(traj)
    pol = [(t, w) for t, s, w in zip(tt.turn, tt.source, tt.weight) if s == SOURCE_POLICY]
    assert all(w == 0.0 for t, w in pol if t == 0) and all(w == 1.0 for t, w in pol if t > 0)
    tt_last = ChatRenderer(tiny_tok, RenderConfig(train_on="last")).render(home_experts[1])
    last_turn = max(tt_last.turn)
    assert all((w > 0) == (t == last_turn and s == SOURCE_POLICY)
               for t, s, w in zip(tt_last.turn, tt_last.source, tt_last.weight))


def test_tokenizer_without_chat_template_is_a_clear_error(tiny_tok):
    import copy

    tok = copy.deepcopy(tiny_tok)
    tok.chat_template = None
    with pytest.raises(RenderError, match="no chat template"):
        ChatRenderer(tok)


def test_non_prefix_template_is_detected(tiny_tok):
    # a template that prints the *number* of messages first: every rendering rewrites its start
    tmpl = "{{ messages|length }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    r = ChatRenderer(tiny_tok, chat_template=tmpl)
    t = Trajectory(id="x", messages=[Message(role="user", content="hi"), Message(role="assistant", content="yo"),
                                     Message(role="user", content="again"), Message(role="assistant", content="ok")])
    with pytest.raises(RenderError, match="not prefix-stable"):
        r.render(t)


class ScriptedModel(torch.nn.Module):
    """Stands in for a causal LM: 'generates' the expert's next assistant turn for a known context.

    It lets us check that a rollout records exactly the sampled ids, and that a perfect policy's
    rollout has the same ids as rendering the expert trajectory (no re-tokenization drift)."""

    def __init__(self, tok, script):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.tok, self.script = tok, script  # {context ids: next assistant-turn ids}

    def generate(self, input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id, **kw):
        rows = []
        for r in range(input_ids.shape[0]):
            ctx = tuple(input_ids[r][attention_mask[r].bool()].tolist())
            rows.append(self.script[ctx])
        width = max(len(x) for x in rows)
        new = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
        for r, x in enumerate(rows):
            new[r, :len(x)] = torch.tensor(x)
        v = len(self.tok)
        logits = []
        for j in range(width):
            lg = torch.zeros(len(rows), v)
            lg[torch.arange(len(rows)), new[:, j]] = 3.0
            logits.append(lg)
        return types.SimpleNamespace(sequences=torch.cat([input_ids, new], 1), logits=tuple(logits))


def test_rollout_of_a_perfect_policy_matches_the_rendered_expert(tiny_tok):
    env = make_env("home")
    tasks = env.tasks("test", 4, seed=3)
    experts = [env.expert(t) for t in tasks]
    r = ChatRenderer(tiny_tok)
    script = {}
    for e in experts:
        tt = r.render(e)
        for k in sorted(set(t for t, s in zip(tt.turn, tt.source) if s == SOURCE_POLICY)):
            pos = [j for j, (s, t) in enumerate(zip(tt.source, tt.turn)) if s == SOURCE_POLICY and t == k]
            script[tuple(tt.ids[:pos[0]])] = tt.ids[pos[0]:pos[-1] + 1]
    model = ScriptedModel(tiny_tok, script)
    eps = run_rollouts(model, tiny_tok, lambda: make_env("home"), tasks,
                       RolloutConfig(max_turns=4, max_new_tokens=64, max_length=1024, batch_size=4), seed=0)
    for ep, expert in zip(eps, experts):
        want = r.render(expert)
        assert ep.tokens.ids == want.ids  # rollout tokens == rendered expert tokens
        assert ep.tokens.source == want.source
        assert r.render(ep.trajectory).ids == ep.tokens.ids  # re-rendering the rollout's IR: no drift
        assert ep.trajectory.outcome.success and ep.trajectory.outcome.termination == "done"
        # sampled log-probs recorded: every policy token had logit 3 against 0 elsewhere
        import math
        v = len(tiny_tok)
        lp = 3.0 - math.log(math.exp(3.0) + v - 1)
        assert all(abs(x - lp) < 1e-5 for x, s in zip(ep.tokens.logprobs, ep.tokens.source) if s == SOURCE_POLICY)


@pytest.mark.parametrize("fmt", ["hermes", "pythonic"])
def test_rollout_under_a_text_tool_format_parses_with_the_format_parser(tiny_tok, fmt):
    """A template without tool support: calls written as text are parsed back by the format's parser
    (the rollout config says parser: auto), and the rollout reproduces the rendered expert."""
    from test_render_adapt import SMOLLM2

    from trajtune.chat.render import RenderConfig

    env = make_env("home")
    tasks = env.tasks("test", 3, seed=5)
    experts = [env.expert(t) for t in tasks]
    r = ChatRenderer(tiny_tok, RenderConfig(tool_format=fmt), chat_template=SMOLLM2)
    assert r.tool_format == fmt
    script = {}
    for e in experts:
        tt = r.render(e)
        for k in sorted(set(t for t, s in zip(tt.turn, tt.source) if s == SOURCE_POLICY)):
            pos = [j for j, (s, t) in enumerate(zip(tt.source, tt.turn)) if s == SOURCE_POLICY and t == k]
            script[tuple(tt.ids[:pos[0]])] = tt.ids[pos[0]:pos[-1] + 1]
    eps = run_rollouts(ScriptedModel(tiny_tok, script), tiny_tok, lambda: make_env("home"), tasks,
                       RolloutConfig(max_turns=4, max_new_tokens=96, max_length=2048, batch_size=3), seed=0,
                       renderer=r)
    for ep, expert in zip(eps, experts):
        assert ep.format_errors == 0 and ep.trajectory.outcome.success
        assert ep.tokens.ids == r.render(expert).ids


def test_rollout_records_sampled_tokens_and_logprobs(tiny_model, tiny_tok):
    env = make_env("home")
    tasks = env.tasks("test", 6, seed=1)
    cfg = RolloutConfig(max_turns=3, max_new_tokens=24, max_length=512, batch_size=3, temperature=1.0)
    eps = run_rollouts(tiny_model, tiny_tok, lambda: make_env("home"), tasks, cfg, seed=7)
    from trajtune.algorithms.batch import collate, token_logprobs

    for ep in eps:
        tt = ep.tokens
        assert tt.termination in ("done", "max_turns", "length", "context_overflow")
        assert len(tt.ids) == len(tt.logprobs) == len(tt.source)
        b = collate([tt], tiny_tok.pad_token_id)
        with torch.no_grad():
            lp, _ = token_logprobs(tiny_model, b)
        recomputed = [0.0] + lp[0].tolist()
        pol = [k for k, s in enumerate(tt.source) if s == SOURCE_POLICY]
        assert pol, "each episode samples at least one token"
        # the recorded log-probs are those of the recorded ids under the model that sampled them
        assert max(abs(recomputed[k] - tt.logprobs[k]) for k in pol) < 1e-3
    # determinism: same seed -> same episodes; another seed -> different ones
    again = run_rollouts(tiny_model, tiny_tok, lambda: make_env("home"), tasks, cfg, seed=7)
    assert [e.tokens.ids for e in again] == [e.tokens.ids for e in eps]
    other = run_rollouts(tiny_model, tiny_tok, lambda: make_env("home"), tasks, cfg, seed=8)
    assert [e.tokens.ids for e in other] != [e.tokens.ids for e in eps]


def test_context_overflow_is_recorded(tiny_model, tiny_tok):
    env = make_env("home")
    tasks = env.tasks("test", 2, seed=1)
    eps = run_rollouts(tiny_model, tiny_tok, lambda: make_env("home"), tasks,
                       RolloutConfig(max_turns=3, max_new_tokens=24, max_length=40, batch_size=2), seed=0)
    assert all(e.trajectory.outcome.termination == "context_overflow" for e in eps)
