"""Every template family in its own tool format: ``tool_format: auto`` trains Gemma 4, LFM2 and
harmony-style templates in the syntax their models write (not as Hermes text), and Hermes stays
the fallback only for templates without tool support.

Round trip per family: a call whose arguments hold every JSON kind is rendered through the
fixture template, the call turn's policy tokens are decoded and parsed with the renderer's parser,
and the call must come back identical; the provenance of every token must still be right (the
tool list and the result are never trained, the call turn ends with its trained closer).
"""

from __future__ import annotations

import pytest
from chat_fixtures import ALL_FAMILIES, TOOLS, policy_texts, rollout_text, tokenizer_for

from trajtune.chat.parsers import parse_tool_calls
from trajtune.chat.render import SOURCE_ENV, SOURCE_POLICY, SOURCE_PROMPT, ChatRenderer, RenderConfig
from trajtune.schema import Message, ToolCall, ToolSpec, Trajectory

#: family -> (tool format auto picks, the parser that reads its calls)
OWN_FORMAT = {"gemma4": ("native", "gemma4"), "lfm2": ("lfm2", "lfm2"), "harmony": ("native", "harmony"),
              "gpt_oss": ("native", "harmony")}
NO_TOOL_SUPPORT = [n for n, f in ALL_FAMILIES.items() if not f.native_tools]

SEARCH = ToolSpec(name="search_notes", description="Search the notes.",
                  parameters={"type": "object", "properties": {"query": {"type": "string"}}})
RICH = {
    "query": 'say "hi", {then} [go] ☂ \\ back',
    "limit": 3,
    "ratio": -0.25,
    "exact": False,
    "since": None,
    "filters": {"tag": {"any": [1, "two", True]}},
    "rows": [{"k": "v"}, []],
    "empty": {},
}
RESULT = "found 2 notes: Zürich, Oslo"


def rich_trajectory() -> Trajectory:
    call = ToolCall(id="call_000000", name="search_notes", arguments=RICH)
    return Trajectory(id="rich", tools=[SEARCH] + TOOLS, messages=[
        Message(role="system", content="You are a careful assistant."),
        Message(role="user", content="Find my notes about cities."),
        Message(role="assistant", tool_calls=[call], reasoning_content="Look it up."),
        Message(role="tool", tool_call_id=call.id, content=RESULT),
        Message(role="assistant", content="Two notes: Zürich and Oslo."),
    ])


def renderer(name: str) -> ChatRenderer:
    return ChatRenderer(tokenizer_for(name), RenderConfig(non_prefix="split"))


@pytest.mark.parametrize("name", list(OWN_FORMAT))
def test_auto_picks_the_familys_own_format(name):
    r = renderer(name)
    assert (r.tool_format, r.parser) == OWN_FORMAT[name], r.tool_format_reason
    assert "hermes" not in r.tool_format_reason


@pytest.mark.parametrize("name", NO_TOOL_SUPPORT)
def test_hermes_stays_the_fallback_for_templates_without_tool_support(name):
    r = renderer(name)
    assert (r.tool_format, r.parser) == ("hermes", "hermes")
    assert "does not render" in r.tool_format_reason


def _decode(r: ChatRenderer, s, keep) -> str:
    return r.tok.decode([i for i, src, t in zip(s.ids, s.source, s.turn) if keep(src, t)], skip_special_tokens=False)


@pytest.mark.parametrize("name", list(OWN_FORMAT))
def test_a_call_with_every_value_kind_round_trips_through_the_template(name):
    r = renderer(name)
    samples = r.render_samples(rich_trajectory())
    split = len(samples) > 1  # one sample per assistant turn (turn = its index), or one sequence
    call, answer = (samples[0], samples[1]) if split else (samples[0], samples[0])
    text = _decode(r, call, lambda src, t: src == SOURCE_POLICY and t == 0)
    closer = r.eots[-1]  # a call turn's closer where it differs from an answer's (Gemma 4, harmony)
    assert text.endswith(closer)
    parsed = parse_tool_calls(text[: -len(closer)], r.parser, reasoning=True)
    assert parsed.errors == []
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("search_notes", RICH)]
    assert parsed.content == ""
    # reasoning: rendered before the call where the template has a place for it, and read back apart
    assert parsed.reasoning == (None if r.reasoning == "drop" else "Look it up.")
    # provenance: trained tokens are exactly the policy tokens, each turn's closer among them
    for s in samples:
        assert all((w > 0) == (src == SOURCE_POLICY) for w, src in zip(s.weight, s.source))
        assert s.source[-1] == SOURCE_POLICY and s.ids[-1] in {r.tok.convert_tokens_to_ids(e) for e in r.eots}
    # the tool list is prompt (never trained), the result environment text, the answer policy alone
    prompt = _decode(r, call, lambda src, t: src == SOURCE_PROMPT)
    assert "Search the notes." in prompt and "Current weather for a city." in prompt
    # (one sequence: the result is environment text; one sample per turn: all before the turn is prompt)
    assert RESULT in _decode(r, answer, lambda src, t: src == (SOURCE_PROMPT if split else SOURCE_ENV))
    said = _decode(r, answer, lambda src, t: src == SOURCE_POLICY and t == 1)
    assert said.endswith(r.eots[0]) and "Two notes: Zürich and Oslo." in said
    assert RESULT not in said and "search_notes" not in said


@pytest.mark.parametrize("name", ["gemma4", "lfm2"])
def test_rollout_text_path_equals_static_render(name):
    """What a rollout builds (prompt, each turn as the model wrote it, the observation text after
    it) is the static rendering: Gemma 4's result and answer continue the call's own turn."""
    r = renderer(name)
    traj = rich_trajectory()
    tt = r.render(traj)
    assert rollout_text(r, traj, policy_texts(r.tok, [tt])) == r.tok.decode(tt.ids, skip_special_tokens=False)


def test_lfm2_lists_the_tools_natively_and_writes_calls_as_the_model_does():
    """Nothing of Hermes reaches an LFM2 prompt: the template's own tool list, the call as pythonic
    text between its markers (calls first, then the text), the result in its response markers."""
    r = renderer("lfm2")
    traj = rich_trajectory()
    traj.messages[2].content = "Searching."
    text = r.tok.decode(r.render(traj).ids, skip_special_tokens=False)
    assert "<tool_call>" not in text and "<tools>" not in text and "<tool_response>" not in text
    assert text.count("<|tool_list_start|>") == 1 and '"name": "search_notes"' in text
    assert ('<|im_start|>assistant\n<|tool_call_start|>[search_notes(query="say \\"hi\\", {then} [go] ☂ \\\\ back", '
            'limit=3, ratio=-0.25, exact=False, since=None, filters={"tag": {"any": [1, "two", True]}}, '
            'rows=[{"k": "v"}, []], empty={})]<|tool_call_end|>Searching.<|im_end|>') in text
    assert f"<|im_start|>tool\n<|tool_response_start|>{RESULT}<|tool_response_end|><|im_end|>" in text


def test_gemma4_call_is_written_with_its_own_value_syntax():
    """The template itself writes the call (native): sorted bare keys, <|"|> strings, true/false/null."""
    r = renderer("gemma4")
    text = r.tok.decode(r.render_samples(rich_trajectory())[0].ids, skip_special_tokens=False)
    q = '<|"|>'
    assert (f"<|tool_call>call:search_notes{{empty:{{}},exact:false,filters:{{tag:{{any:[1,{q}two{q},true]}}}},"
            f"limit:3,query:{q}say \"hi\", {{then}} [go] ☂ \\ back{q},ratio:-0.25,rows:[{{k:{q}v{q}}},[]],since:null}}"
            "<tool_call|><|tool_response>") in text
    assert f"response:search_notes{{value:{q}{RESULT}{q}}}<tool_response|>Two notes" in text


def test_explicit_lfm2_format_on_a_template_without_a_tool_list_is_refused():
    """lfm2 leaves the tool list to the template: forced onto one that writes none, the tools would
    be lost, and the renderer says so instead of training without them."""
    from trajtune.chat.render import RenderError

    r = ChatRenderer(tokenizer_for("smollm2"), RenderConfig(tool_format="lfm2"))
    with pytest.raises(RenderError, match="do not appear in the rendered prompt"):
        r.render(rich_trajectory())
