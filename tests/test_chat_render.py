"""Rendering through real-family chat templates: policy tokens are exactly the assistant turns.

Expected assistant text comes from ``chat_fixtures.EXPECT`` (written from each family's format,
not from the renderer); expected whole-conversation text comes from ``apply_chat_template``.
"""

from __future__ import annotations

import json
import re

import pytest
from chat_fixtures import EXPECT, FAMILIES, TOOLS, conversation, policy_texts, rollout_text, tokenizer_for

from trajtune.chat.render import (
    SOURCE_ENV,
    SOURCE_POLICY,
    SOURCE_PROMPT,
    ChatRenderer,
    NonPrefixError,
    RenderConfig,
    RenderError,
)
from trajtune.chat.templates import mistral_call_id
from trajtune.schema import Message, ToolCall, Trajectory

STABLE = [n for n, f in FAMILIES.items() if f.prefix_stable]
UNSTABLE = [n for n, f in FAMILIES.items() if not f.prefix_stable]


def policy_by_turn(tok, samples):
    out: dict[int, list[int]] = {}
    for s in samples:
        for i, src, t in zip(s.ids, s.source, s.turn):
            if src == SOURCE_POLICY:
                out.setdefault(t, []).append(i)
    return {t: tok.decode(ids, skip_special_tokens=False) for t, ids in out.items()}


def mistral_ids(text: str) -> list[str]:
    return re.findall(r'"id": "([^"]*)"', text)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_policy_tokens_are_exactly_each_assistant_turn(name):
    fam = FAMILIES[name]
    tok = tokenizer_for(name)
    traj = conversation()
    r = ChatRenderer(tok, RenderConfig(non_prefix="split"))
    assert r.eot == fam.eot
    samples = r.render_samples(traj)
    assert len(samples) == (1 if fam.prefix_stable else 4)
    got = policy_by_turn(tok, samples)
    assistants = [m for m in traj.messages if m.role == "assistant"]
    assert sorted(got) == [0, 1, 2, 3]
    if name == "mistral":
        ids = [i for k in (0, 2) for i in mistral_ids(got[k])]
        assert len(ids) == 2 and len(set(ids)) == 2
        assert all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in ids)
        id_map = {"call_000000": ids[0], "call_000001": ids[1]}
        expected = [EXPECT[name](m, id_map) for m in assistants]
    else:
        expected = [EXPECT[name](m) for m in assistants]
    assert [got[k] for k in range(4)] == expected
    for s in samples:
        s.check()
        for src, w in zip(s.source, s.weight):
            assert (w == 1.0) if src == SOURCE_POLICY else (w == 0.0)
        # each sample ends with the end-of-turn token, trained
        assert s.ids[-1] == tok.convert_tokens_to_ids(fam.eot) and s.source[-1] == SOURCE_POLICY


@pytest.mark.parametrize("name", STABLE)
def test_stable_render_reproduces_the_template_text(name):
    tok = tokenizer_for(name)
    traj = conversation()
    r = ChatRenderer(tok)
    tt = r.render(traj)
    full = tok.apply_chat_template(r.template_messages(traj.messages), tools=[t.to_openai() for t in TOOLS],
                                   tokenize=False)
    eot = FAMILIES[name].eot
    assert tok.decode(tt.ids, skip_special_tokens=False) == full[: full.rfind(eot) + len(eot)]
    # the tool result after the first call is environment text, the second user turn prompt text
    env_text = tok.decode([i for i, s in zip(tt.ids, tt.source) if s == SOURCE_ENV], skip_special_tokens=False)
    assert '"temp": 21' in env_text and "ok" in env_text and "Remind me" not in env_text
    prompt_text = tok.decode([i for i, s in zip(tt.ids, tt.source) if s == SOURCE_PROMPT], skip_special_tokens=False)
    assert "Remind me" in prompt_text and "careful assistant" in prompt_text
    assert r.render_samples(traj)[0].ids == tt.ids
    assert [t for t, s in zip(tt.turn, tt.source) if s == SOURCE_POLICY][-1] == 3


@pytest.mark.parametrize("name", UNSTABLE)
def test_non_prefix_templates_raise_or_split(name):
    tok = tokenizer_for(name)
    traj = conversation()
    strict = ChatRenderer(tok, RenderConfig(non_prefix="error"))
    with pytest.raises(NonPrefixError, match="not prefix-stable"):
        strict.render(traj)
    with pytest.raises(NonPrefixError):
        strict.render_samples(traj)
    split = ChatRenderer(tok, RenderConfig(non_prefix="split"))
    with pytest.raises(NonPrefixError, match="render_samples"):
        split.render(traj)
    samples = split.render_samples(traj)
    msgs = split.template_messages(traj.messages)
    tools = [t.to_openai() for t in TOOLS]
    a_idx = [i for i, m in enumerate(traj.messages) if m.role == "assistant"]
    for k, (s, i) in enumerate(zip(samples, a_idx)):
        # each sample is exactly the template's own rendering of the conversation through turn k
        text = tok.decode(s.ids, skip_special_tokens=False)
        own = tok.apply_chat_template(msgs[: i + 1], tools=tools, tokenize=False)
        assert own.startswith(text) and text.endswith(FAMILIES[name].eot)
        assert set(s.turn) == {k} and s.meta["split_turn"] == k and s.meta["n_samples"] == 4
        assert s.source[0] == SOURCE_PROMPT


def test_one_user_turn_is_prefix_stable_for_mistral_but_not_for_reasoning_free_qwen3():
    # Mistral only moves tools/system when a new user turn arrives.
    assert ChatRenderer(tokenizer_for("mistral")).is_prefix_stable(conversation(two_users=False))
    # Qwen3 gives the last turn an empty <think></think> that later renderings drop.
    traj = conversation(two_users=False)
    for m in traj.messages:
        m.reasoning_content = None
    assert not ChatRenderer(tokenizer_for("qwen3")).is_prefix_stable(traj)


def test_split_skips_untrained_turns_unless_asked():
    tok = tokenizer_for("qwen3")
    r = ChatRenderer(tok, RenderConfig(non_prefix="split", train_on="last"))
    assert [s.meta["split_turn"] for s in r.render_samples(conversation())] == [3]
    all_turns = r.render_samples(conversation(), include_untrained=True)
    assert [max(s.weight) for s in all_turns] == [0.0, 0.0, 0.0, 1.0]


def test_end_of_turn_detected_where_it_differs_from_eos():
    for name in ("llama3", "gemma", "phi3"):
        tok = tokenizer_for(name)
        assert tok.eos_token != FAMILIES[name].eot
        assert ChatRenderer(tok).eot == FAMILIES[name].eot
    assert ChatRenderer(tokenizer_for("gemma"), RenderConfig(end_of_turn="<eos>")).eot == "<eos>"


def test_mistral_ids_are_deterministic_and_shared_by_call_and_result():
    tok = tokenizer_for("mistral")
    r = ChatRenderer(tok, RenderConfig(non_prefix="split"))
    traj = conversation(two_users=False)
    text = tok.decode(r.render(traj).ids, skip_special_tokens=False)
    call_ids = mistral_ids(text)
    result_ids = re.findall(r'"call_id": "([^"]*)"', text)
    assert call_ids == result_ids and len(call_ids) == 1
    # a pure function of the original id, independent of the process
    assert call_ids[0] == mistral_call_id("call_000000")
    assert tok.decode(ChatRenderer(tok).render(traj).ids, skip_special_tokens=False) == text
    # ids that already qualify are kept
    traj2 = conversation(two_users=False)
    traj2.messages[2].tool_calls[0].id = "abcDEF123"
    traj2.messages[3].tool_call_id = "abcDEF123"
    assert '"call_id": "abcDEF123"' in tok.decode(r.render(traj2).ids, skip_special_tokens=False)


def test_mistral_without_id_adaptation_gives_a_clear_error():
    r = ChatRenderer(tokenizer_for("mistral"), RenderConfig(call_ids="keep"))
    with pytest.raises(RenderError, match="length 9"):
        r.render(conversation(two_users=False))


def test_template_that_refuses_a_generation_prompt_after_a_tool_result_is_handled():
    # Accepts add_generation_prompt only after a user turn; renders finished assistant turns anywhere.
    tpl = ("{% if add_generation_prompt and messages[-1].role != 'user' %}"
           "{{ raise_exception('the last message must be a user turn') }}{% endif %}"
           "{% if tools %}<|im_start|>tools\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
           "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
           "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
           "<|im_end|>\n{% endfor %}"
           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tok = tokenizer_for("chatml")
    r = ChatRenderer(tok, chat_template=tpl)
    traj = conversation(two_users=False)
    tt = r.render(traj)
    assert policy_by_turn(tok, [tt]) == {
        0: '<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}</tool_call><|im_end|>',
        1: "It is 21 °C and sunny in Zürich.<|im_end|>"}
    assert r.prompt_text(traj.messages[:4], traj.tools).endswith("</tool_call><|im_end|>\n<|im_start|>tool\n"
                                                                 '{"temp": 21, "sky": "sunny"}<|im_end|>\n'
                                                                 "<|im_start|>assistant\n")


def test_template_that_cannot_render_a_conversation_errors_clearly():
    # Gemma-style strict alternation: two tool results in a row (parallel calls) cannot be rendered.
    a = ToolCall(id="c1", name="get_weather", arguments={"city": "Oslo"})
    b = ToolCall(id="c2", name="get_weather", arguments={"city": "Lima"})
    traj = Trajectory(id="par", tools=TOOLS, messages=[
        Message(role="user", content="Oslo and Lima?"), Message(role="assistant", tool_calls=[a, b]),
        Message(role="tool", tool_call_id="c1", content="cold"), Message(role="tool", tool_call_id="c2", content="warm"),
        Message(role="assistant", content="Cold and warm.")])
    r = ChatRenderer(tokenizer_for("gemma"))
    with pytest.raises(RenderError) as e:
        r.render(traj)
    msg = str(e.value)
    assert "roles must alternate" in msg and "user → assistant → tool → tool" in msg
    assert "4 message(s)" in msg and "with generation prompt" in msg
    # the same template renders the sequential version of that conversation
    assert r.render(conversation(two_users=False)).n_policy() > 0


def test_arguments_are_passed_as_dicts_and_raw_arguments_are_not_double_encoded():
    tok = tokenizer_for("chatml")
    r = ChatRenderer(tok)
    text = tok.decode(r.render(conversation(two_users=False)).ids, skip_special_tokens=False)
    assert '"arguments": {"city": "Zürich", "unit": "celsius"}' in text
    bad = ToolCall(id="c1", name="f", arguments=None, arguments_raw='{"a": 1')  # the model wrote broken JSON
    ok = ToolCall(id="c2", name="g", arguments=None, arguments_raw='{"b": [1, 2]}')
    traj = Trajectory(id="t", messages=[Message(role="user", content="hi"),
                                        Message(role="assistant", tool_calls=[bad, ok])])
    policy = tok.decode(r.render(traj).policy_ids(), skip_special_tokens=False)
    assert '{"name": "f", "arguments": {"a": 1}' in policy  # raw text, as the model wrote it
    assert '{"name": "g", "arguments": {"b": [1, 2]}}' in policy


def test_reasoning_modes():
    traj = conversation(two_users=False)
    chatml = tokenizer_for("chatml")
    # the template knows nothing of reasoning: auto drops it
    assert "<think>" not in chatml.decode(ChatRenderer(chatml).render(traj).policy_ids())
    inline = ChatRenderer(chatml, RenderConfig(reasoning="inline")).render(traj)
    first = chatml.decode(inline.policy_ids(), skip_special_tokens=False)
    assert first.startswith("<think>\nThe user wants the weather.\n</think>\n\n\n<tool_call>")  # content, then "\\n" + call
    qwen = tokenizer_for("qwen3")
    r = ChatRenderer(qwen, RenderConfig(non_prefix="split"))
    assert r.reasoning == "field"
    assert "<think>\nI have it.\n</think>" in qwen.decode(r.render_samples(traj)[-1].policy_ids())
    # enable_thinking=False reaches the template through template_kwargs
    r2 = ChatRenderer(qwen, RenderConfig(template_kwargs={"enable_thinking": False}))
    assert r2.prompt_text(traj.messages[:2], traj.tools).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_observation_text_tolerates_trailing_eos_and_split_rewrites():
    traj = conversation(two_users=False)
    hist = traj.messages[:4]  # ... assistant call, tool result
    phi = ChatRenderer(tokenizer_for("phi3"))
    assert phi.observation_text(hist, traj.tools, 3) == \
        '\n<|user|>\nObservation: {"temp": 21, "sky": "sunny"}<|end|>\n<|assistant|>\n'
    for m in hist:
        m.reasoning_content = None
    qwen = tokenizer_for("qwen3")
    with pytest.raises(NonPrefixError):
        ChatRenderer(qwen).observation_text(hist, traj.tools, 3)
    obs = ChatRenderer(qwen, RenderConfig(non_prefix="split")).observation_text(hist, traj.tools, 3)
    assert obs == '\n<|im_start|>user\n<tool_response>\n{"temp": 21, "sky": "sunny"}\n</tool_response><|im_end|>\n' \
                  "<|im_start|>assistant\n"


# -- the tiny template and the home environment ----------------------------------------------------

@pytest.fixture(scope="module")
def home():
    from trajtune.envs import make_env
    from trajtune.models.tiny import build_tokenizer

    env = make_env("home")
    trajs = [env.expert(t) for t in env.tasks("train", 6, seed=3)]
    tok = build_tokenizer([m.text() for t in trajs for m in t.messages], vocab_size=400)
    return tok, trajs


def tiny_turn(m: Message) -> str:
    """The tiny ChatML template's assistant turn, written from its format."""
    parts = [m.text()] if m.text() else []
    calls = ["<tool_call>" + json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
             + "</tool_call>" for c in m.tool_calls or []]
    return "\n".join(parts + calls) + "<|im_end|>"


def test_tiny_template_provenance_on_home_expert_trajectories(home):
    tok, trajs = home
    r = ChatRenderer(tok)
    assert r.eot == "<|im_end|>"
    for traj in trajs:
        tt = r.render(traj)
        got = policy_by_turn(tok, [tt])
        want = [tiny_turn(m) for m in traj.messages if m.role == "assistant"]
        assert [got[k] for k in sorted(got)] == want
        assert r.render_samples(traj)[0].ids == tt.ids
        full = tok.apply_chat_template(r.template_messages(traj.messages),
                                       tools=[t.to_openai() for t in traj.tools], tokenize=False)
        assert tok.decode(tt.ids, skip_special_tokens=False) == full.rstrip("\n")


def test_tiny_template_trailing_observation_and_train_on_last(home):
    tok, trajs = home
    traj = trajs[0].model_copy(deep=True)
    traj.messages = traj.messages[:-1]  # ends with a tool result
    tt = ChatRenderer(tok).render(traj)
    assert tok.decode(tt.ids, skip_special_tokens=False).endswith("</tool_response><|im_end|>\n")
    assert tt.source[-1] == SOURCE_ENV
    last = ChatRenderer(tok, RenderConfig(train_on="last")).render(trajs[0])
    turns = {t for t, s, w in zip(last.turn, last.source, last.weight) if s == SOURCE_POLICY and w > 0}
    n = sum(m.role == "assistant" for m in trajs[0].messages)
    assert turns == {n - 1}


@pytest.mark.parametrize("name", STABLE)
def test_rollout_text_path_equals_static_render(name):
    """prompt_text + turns + observation_text (how rollouts build sequences) == render() (static data)."""
    tok = tokenizer_for(name)
    traj = conversation()
    r = ChatRenderer(tok)
    tt = r.render(traj)
    assert rollout_text(r, traj, policy_texts(tok, [tt])) == tok.decode(tt.ids, skip_special_tokens=False)


def test_tiny_observation_text(home):
    tok, trajs = home
    traj = trajs[0]
    i = next(k for k, m in enumerate(traj.messages) if m.role == "tool")
    obs = ChatRenderer(tok).observation_text(traj.messages[: i + 1], traj.tools, i)
    assert obs == "\n<|im_start|>tool\n<tool_response>" + traj.messages[i].text() + \
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"


def test_visible_thought_is_trained_unless_dropped():
    tok = tokenizer_for("chatml")
    traj = Trajectory(id="t", messages=[Message(role="user", content="hi"),
                                        Message(role="assistant", thought="Greet back.", content="Hello!")])
    assert tok.decode(ChatRenderer(tok).render(traj).policy_ids(), skip_special_tokens=False) == \
        "Greet back.\n\nHello!<|im_end|>"
    assert tok.decode(ChatRenderer(tok, RenderConfig(thought="drop")).render(traj).policy_ids(),
                      skip_special_tokens=False) == "Hello!<|im_end|>"
