"""Templates that cannot take a conversation as it is: tool formats for templates without tool
support, and the adaptations found by probing (system folded, tool results as user turns, strict
alternation, content parts, arguments as JSON text, reasoning under `thinking`, an end of turn per
turn type, a stop token after an end-of-response marker).

Each template here is a few lines in the shape of a real family; expected texts are written from
the format, independently of the renderer.
"""

from __future__ import annotations

import json
from functools import lru_cache

import pytest
from chat_fixtures import CALL_1, CALL_2, CORPUS, conversation, policy_texts, rollout_text, tokenizer_for

from trajtune.chat.doctor import check_template
from trajtune.chat.parsers import parse_tool_calls
from trajtune.chat.render import SOURCE_ENV, SOURCE_POLICY, ChatRenderer, RenderConfig, RenderError
from trajtune.schema import Message, ToolCall, Trajectory

# SmolLM2-135M-Instruct's own template (ChatML, no tool support: it prints any role and ignores
# `tools` and `tool_calls`).
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
           "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
           "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@lru_cache(maxsize=None)
def make_tok(special: tuple[str, ...], eos: str) -> object:
    """A byte-level BPE with the given special tokens (the first is bos/pad unless it is eos)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(special),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=eos,
                                   additional_special_tokens=[s for s in special if s != eos],
                                   clean_up_tokenization_spaces=False)


def decoded(tok, tt) -> str:
    return tok.decode(tt.ids, skip_special_tokens=False)


def _j(v) -> str:
    return json.dumps(v, ensure_ascii=False)


# -- tool formats on a template without tool support -------------------------------------------

def test_auto_writes_hermes_text_for_a_template_without_tools():
    tok = tokenizer_for("chatml")
    r = ChatRenderer(tok, chat_template=SMOLLM2)
    assert r.tool_format == "hermes" and r.parser == "hermes"
    assert "does not render tools or tool calls" in r.tool_format_reason
    traj = conversation(content_with_call=True)
    tt = r.render(traj)
    call1 = '<tool_call>\n{"name": "get_weather", "arguments": ' + _j(CALL_1.arguments) + "}\n</tool_call>"
    call2 = '<tool_call>\n{"name": "create_reminder", "arguments": ' + _j(CALL_2.arguments) + "}\n</tool_call>"
    assert policy_texts(tok, [tt]) == [
        "Let me check.\n" + call1 + "<|im_end|>",
        "It is 21 °C and sunny in Zürich.<|im_end|>",
        call2 + "<|im_end|>",
        "Done.<|im_end|>",
    ]
    text = decoded(tok, tt)
    # the tool schemas follow the data's own system prompt in the system turn (SmolLM2's default is replaced)
    assert text.startswith("<|im_start|>system\nYou are a careful assistant.\n\n# Tools\n")
    for t in traj.tools:
        assert _j(t.to_openai()) in text
    env = tok.decode([i for i, s in zip(tt.ids, tt.source) if s == SOURCE_ENV], skip_special_tokens=False)
    assert env.count("<tool_response>\n") == 2 and '{"temp": 21, "sky": "sunny"}' in env


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "pythonic"])
def test_each_text_format_parses_back_with_its_parser(fmt):
    tok = tokenizer_for("chatml")
    r = ChatRenderer(tok, RenderConfig(tool_format=fmt), chat_template=SMOLLM2)
    assert r.parser == fmt
    traj = conversation(content_with_call=True)
    texts = policy_texts(tok, [r.render(traj)])
    assistants = [m for m in traj.messages if m.role == "assistant"]
    for text, m in zip(texts, assistants):
        assert text.endswith("<|im_end|>")
        parsed = parse_tool_calls(text[: -len("<|im_end|>")], r.parser)
        assert parsed.errors == []
        assert [(c.name, c.arguments) for c in parsed.tool_calls] == [(c.name, c.arguments) for c in m.tool_calls or []]
        assert parsed.content == m.text()


def test_auto_keeps_the_native_format_where_the_template_has_one():
    for name, parser in (("chatml", "hermes"), ("llama3", "llama3_json"), ("gemma", "pythonic")):
        r = ChatRenderer(tokenizer_for(name))
        assert (r.tool_format, r.parser) == ("native", parser), name


def test_native_format_on_a_template_without_tools_is_refused_not_dropped():
    r = ChatRenderer(tokenizer_for("chatml"), RenderConfig(tool_format="native"), chat_template=SMOLLM2)
    with pytest.raises(RenderError, match="tool call 'get_weather' is not rendered"):
        r.render(conversation())
    answer_only = Trajectory(id="t", tools=conversation().tools, messages=[
        Message(role="user", content="hi"), Message(role="assistant", content="hello")])
    with pytest.raises(RenderError, match=r"tools \['get_weather', 'create_reminder'\] do not appear"):
        r.render(answer_only)
    report = check_template(tokenizer_for("chatml"), chat_template=SMOLLM2, config=RenderConfig(tool_format="native"))
    assert not report.ok and report.get("system_and_tools").status == "fail"
    auto = check_template(tokenizer_for("chatml"), chat_template=SMOLLM2)
    assert auto.ok and auto.tool_format == "hermes" and auto.parser == "hermes"


def test_rollout_text_path_equals_static_render_under_a_text_format():
    """prompt_text + turns + observation_text (how rollouts build sequences) == render()."""
    tok = tokenizer_for("chatml")
    r = ChatRenderer(tok, chat_template=SMOLLM2)
    traj = conversation()
    tt = r.render(traj)
    assert rollout_text(r, traj, policy_texts(tok, [tt])) == decoded(tok, tt)


# -- adaptations found by probing --------------------------------------------------------------

# Gemma 1/2 style: raises on a system message; user/model turns; no tool support.
NO_SYSTEM = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
             "{{ raise_exception('System role not supported') }}{% endif %}"
             "{% if (m['role'] == 'assistant') != (loop.index0 % 2 == 1) %}"
             "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
             "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
             "{{ '<start_of_turn>' + role + '\n' + m['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
             "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")


def test_system_refused_and_strict_alternation_fold_and_merge():
    tok = tokenizer_for("gemma")
    r = ChatRenderer(tok, chat_template=NO_SYSTEM)
    p = r.profile
    assert (p.system_role, p.alternation, p.tool_role, r.tool_format) == ("fold", True, "user", "hermes")
    assert r.eot == "<end_of_turn>"
    call = ToolCall(id="call_000000", name="get_weather", arguments={"city": "Oslo"})
    traj = Trajectory(id="alt", tools=conversation().tools, messages=[
        Message(role="system", content="Be brief."), Message(role="user", content="Weather in Oslo?"),
        Message(role="assistant", tool_calls=[call]), Message(role="tool", tool_call_id=call.id, content="cold"),
        Message(role="user", content="And tomorrow?"), Message(role="assistant", content="Also cold.")])
    tt = r.render(traj)
    text = decoded(tok, tt)
    # the system prompt and the tool list open the first user turn
    assert text.startswith("<bos><start_of_turn>user\nBe brief.\n\n# Tools\n")
    # the tool result and the user message after it share one user turn
    assert ("<start_of_turn>user\n<tool_response>\ncold\n</tool_response>\n\nAnd tomorrow?<end_of_turn>\n"
            "<start_of_turn>model\nAlso cold.<end_of_turn>") in text
    assert policy_texts(tok, [tt])[1] == "Also cold.<end_of_turn>"
    env = tok.decode([i for i, s in zip(tt.ids, tt.source) if s == SOURCE_ENV], skip_special_tokens=False)
    assert "cold" in env and "And tomorrow?" in env  # one segment, marked as environment text
    report = check_template(tok, chat_template=NO_SYSTEM)
    assert report.ok, report.format_text()
    notes = " ".join(report.adaptations)
    assert "folded into the first user turn" in notes and "strict user/assistant alternation" in notes
    assert "tool result counts as the user's turn" in notes


# Idefics3 / SmolVLM style: content is only ever read as a list of parts.
PARTS_ONLY = ("{% for message in messages %}{{ message['role'] | capitalize }}: "
              "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}{% endif %}"
              "{% endfor %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")


def test_parts_only_template_gets_parts_instead_of_rendering_nothing():
    tok = make_tok(("<|endoftext|>", "<end_of_utterance>"), "<end_of_utterance>")
    # passed plain strings, this template renders every message empty
    assert tok.apply_chat_template([{"role": "user", "content": "What is up"}], chat_template=PARTS_ONLY,
                                   tokenize=False) == "User: <end_of_utterance>\n"
    r = ChatRenderer(tok, chat_template=PARTS_ONLY)
    assert r.profile.content == "parts"
    traj = Trajectory(id="p", messages=[Message(role="user", content="What is up"),
                                        Message(role="assistant", content="Not much.")])
    tt = r.render(traj)
    assert decoded(tok, tt) == "User: What is up<end_of_utterance>\nAssistant: Not much.<end_of_utterance>"
    assert policy_texts(tok, [tt]) == [" Not much.<end_of_utterance>"]
    with pytest.raises(RenderError, match="no text tool format renders through it"):
        ChatRenderer(tok, RenderConfig(content_format="string"), chat_template=PARTS_ONLY)
    forced = ChatRenderer(tok, RenderConfig(content_format="string", tool_format="native"), chat_template=PARTS_ONLY)
    with pytest.raises(RenderError, match="content does not appear"):
        forced.render(traj)


# DeepSeek-V3 style call rendering: arguments concatenated as text (a dict raises).
ARGS_STRING = ("{% if tools %}<|im_start|>system\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
               "{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' + m.content }}"
               "{% for c in m.tool_calls or [] %}"
               "{{ '<tool_call>{\"name\": \"' + c.function.name + '\", \"arguments\": ' + c.function.arguments"
               " + '}</tool_call>' }}{% endfor %}{{ '<|im_end|>\n' }}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def test_arguments_passed_as_json_text_where_the_template_concatenates_them():
    tok = tokenizer_for("chatml")
    r = ChatRenderer(tok, chat_template=ARGS_STRING)
    assert r.profile.arguments == "string" and r.tool_format == "native" and r.parser == "hermes"
    traj = conversation(two_users=False)
    first = policy_texts(tok, [r.render(traj)])[0]
    assert first == '<tool_call>{"name": "get_weather", "arguments": ' + _j(CALL_1.arguments) + "}</tool_call><|im_end|>"


# GPT-OSS style: a call turn ends with <|call|>, the answer being generated with <|return|>, and an
# answer in the history with <|end|>; reasoning is read from `thinking`.
HARMONY = ("{% if tools %}<|start|>developer<|message|>{{ tools | tojson }}<|end|>{% endif %}"
           "{% for m in messages %}"
           "{% if m.role == 'assistant' %}"
           "{% if m.tool_calls %}{% for c in m.tool_calls %}<|start|>assistant<|channel|>commentary to=functions."
           "{{ c.function.name }}<|message|>{{ c.function.arguments | tojson }}<|call|>{% endfor %}"
           "{% else %}{% if m.thinking and loop.last %}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}"
           "<|end|>{% endif %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}"
           "{% if loop.last %}<|return|>{% else %}<|end|>{% endif %}{% endif %}"
           "{% elif m.role == 'tool' %}<|start|>functions.x to=assistant<|message|>{{ m.content }}<|end|>"
           "{% else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endif %}{% endfor %}"
           "{% if add_generation_prompt %}<|start|>assistant{% endif %}")
HARMONY_SPECIAL = ("<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>")


def test_end_of_turn_per_turn_type_and_reasoning_under_thinking():
    tok = make_tok(HARMONY_SPECIAL, "<|return|>")
    r = ChatRenderer(tok, RenderConfig(tool_format="native", non_prefix="split"), chat_template=HARMONY)
    assert r.eots == ["<|return|>", "<|call|>"]
    assert r.reasoning == "field"  # (transformers >= 5.2x also copies reasoning_content to `thinking`)
    assert r.stop_ids() == [tok.convert_tokens_to_ids("<|return|>"), tok.convert_tokens_to_ids("<|call|>")]
    traj = conversation()
    samples = r.render_samples(traj)
    assert len(samples) == 4  # the history rewrites <|return|> as <|end|>: one sample per turn
    first, answer, second, last = policy_texts(tok, samples)
    assert first == "<|channel|>commentary to=functions.get_weather<|message|>" + _j(CALL_1.arguments) + "<|call|>"
    assert answer == ("<|channel|>analysis<|message|>I have it.<|end|><|start|>assistant<|channel|>final<|message|>"
                      "It is 21 °C and sunny in Zürich.<|return|>")
    assert second.endswith("<|call|>") and last.endswith("Done.<|return|>")
    for s in samples:
        assert s.source[-1] == SOURCE_POLICY and s.weight[-1] == 1.0


def test_probe_finds_reasoning_under_thinking():
    """A template that reads only `thinking` (older transformers pass reasoning_content through as is)."""
    from trajtune.chat.profile import probe_template

    def render(msgs, tools, gen):
        return "".join(f"[{m['role']}]{m.get('thinking', '')}|{m['content']}" for m in msgs)

    assert probe_template(render).reasoning_field == "thinking"


# Cohere Command R7B style: the response closes with <|END_RESPONSE|>, then the real stop token.
COHERE = ("{% for m in messages %}<|START_OF_TURN_TOKEN|>"
          "{% if m.role == 'assistant' %}<|CHATBOT_TOKEN|><|START_RESPONSE|>{{ m.content }}<|END_RESPONSE|>"
          "{% else %}<|USER_TOKEN|>{{ m.content }}{% endif %}<|END_OF_TURN_TOKEN|>{% endfor %}"
          "{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}")
COHERE_SPECIAL = ("<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>",
                  "<|START_RESPONSE|>", "<|END_RESPONSE|>")


def test_the_stop_token_after_an_end_of_response_marker_is_trained():
    tok = make_tok(COHERE_SPECIAL, "<|END_OF_TURN_TOKEN|>")
    r = ChatRenderer(tok, chat_template=COHERE)
    assert r.eots == ["<|END_OF_TURN_TOKEN|>"]
    traj = Trajectory(id="c", messages=[Message(role="user", content="Hi"), Message(role="assistant", content="Hello."),
                                        Message(role="user", content="Bye"), Message(role="assistant", content="Bye.")])
    tt = r.render(traj)
    assert policy_texts(tok, [tt]) == ["<|START_RESPONSE|>Hello.<|END_RESPONSE|><|END_OF_TURN_TOKEN|>",
                                       "<|START_RESPONSE|>Bye.<|END_RESPONSE|><|END_OF_TURN_TOKEN|>"]
    assert tt.ids[-1] == tok.convert_tokens_to_ids("<|END_OF_TURN_TOKEN|>") and tt.weight[-1] == 1.0


def test_think_mentioned_only_in_a_comment_does_not_switch_reasoning_inline():
    tpl = "{#- this template has no <think> support; reasoning_content is ignored -#}" + SMOLLM2
    r = ChatRenderer(tokenizer_for("chatml"), chat_template=tpl)
    assert r.reasoning == "drop"
    inline = ChatRenderer(tokenizer_for("chatml"), chat_template=SMOLLM2 + "{# #}{% if false %}<think>{% endif %}")
    assert inline.reasoning == "inline"


# -- the renderer refuses what a template drops -------------------------------------------------

DROPS_TOOL_RESULTS = SMOLLM2.replace("{% for message in messages %}",
                                     "{% for message in messages if message['role'] != 'tool' %}")


def test_dropped_tool_results_are_refused_naming_the_message():
    tok = tokenizer_for("chatml")
    auto = ChatRenderer(tok, chat_template=DROPS_TOOL_RESULTS)
    assert auto.profile.tool_role == "user"  # found by probing: results go in as user turns
    assert "<tool_response>\nok\n</tool_response>" in decoded(tok, auto.render(conversation()))
    forced = ChatRenderer(tok, RenderConfig(tool_role="native"), chat_template=DROPS_TOOL_RESULTS)
    with pytest.raises(RenderError, match=r"message 3 \(tool\): the tool result does not appear"):
        forced.render(conversation())
    split = ChatRenderer(tok, RenderConfig(tool_role="native", non_prefix="split"), chat_template=DROPS_TOOL_RESULTS)
    with pytest.raises(RenderError, match="the tool result does not appear"):
        split.render_split(conversation())


def test_single_turn_call_is_a_trained_target_through_its_end_of_turn():
    """The single-turn function-calling shape (user -> call, no result) renders with the call trained."""
    tok = tokenizer_for("chatml")
    call = ToolCall(id="call_000000", name="get_weather", arguments={"city": "Oslo"})
    traj = Trajectory(id="s", tools=conversation().tools,
                      messages=[Message(role="user", content="Weather in Oslo?"),
                                Message(role="assistant", tool_calls=[call])])
    for r in (ChatRenderer(tok), ChatRenderer(tok, chat_template=SMOLLM2)):
        tt = r.render(traj)
        (text,) = policy_texts(tok, [tt])
        assert '"name": "get_weather"' in text and text.endswith("<|im_end|>")
        assert tt.ids[-1] == tok.convert_tokens_to_ids("<|im_end|>") and tt.weight[-1] == 1.0
