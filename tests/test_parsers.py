"""Tool-call parsers: calls and errors from model text, never an exception, never evaluation."""

from __future__ import annotations

import pytest
from chat_fixtures import EXPECT, FAMILIES, NEW_FAMILIES, cohere_ids, conversation, tokenizer_for

from trajtune.chat import parsers as P
from trajtune.chat.parsers import available_parsers, detect_parser, parse_tool_calls, split_reasoning
from trajtune.chat.render import SOURCE_POLICY, ChatRenderer, RenderConfig

PARSER_FNS = {"hermes": P.parse_hermes, "mistral": P.parse_mistral, "llama3_json": P.parse_llama3_json,
              "pythonic": P.parse_pythonic, "react": P.parse_react, "deepseek": P.parse_deepseek,
              "xml": P.parse_xml, "glm45": P.parse_glm45, "nemotron": P.parse_nemotron, "cohere": P.parse_cohere,
              "lfm2": P.parse_lfm2, "harmony": P.parse_harmony, "gemma4": P.parse_gemma4}

VALID = {
    "hermes": 'Sure.\n<tool_call>\n{"name": "f", "arguments": {"q": "say \\"hi\\" ☂"}}\n</tool_call>',
    "mistral": 'Sure.[TOOL_CALLS] [{"name": "f", "arguments": {"q": "say \\"hi\\" ☂"}, "id": "a1B2c3D4e"}]',
    "llama3_json": 'Sure. {"name": "f", "parameters": {"q": "say \\"hi\\" ☂"}}',
    "pythonic": 'Sure.\n```tool_code\n[f(q="say \\"hi\\" ☂")]\n```',
    "react": 'Sure.\nAction: f\nAction Input: {"q": "say \\"hi\\" ☂"}',
    "deepseek": 'Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n'
                '{"q": "say \\"hi\\" ☂"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "xml": 'Sure.\n\n<tool_call>\n<function=f>\n<parameter=q>\nsay "hi" ☂\n</parameter>\n</function>\n</tool_call>',
    "glm45": 'Sure.\n<tool_call>f\n<arg_key>q</arg_key>\n<arg_value>say "hi" ☂</arg_value>\n</tool_call>',
    "nemotron": 'Sure.<TOOLCALL>[{"name": "f", "arguments": {"q": "say \\"hi\\" ☂"}}]</TOOLCALL>',
    "cohere": 'Sure.<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "f", "parameters": {"q": "say \\"hi\\" ☂"}}]'
              '<|END_ACTION|>',
    "lfm2": '<|tool_call_start|>[f(q="say \\"hi\\" ☂")]<|tool_call_end|>Sure.',
    "harmony": '<|channel|>commentary<|message|>Sure.<|end|><|start|>assistant to=functions.f<|channel|>commentary '
               'json<|message|>{"q": "say \\"hi\\" ☂"}',
    "gemma4": 'Sure.<|tool_call>call:f{q:<|"|>say "hi" ☂<|"|>}<tool_call|>',
}


def test_all_parsers_registered():
    assert set(PARSER_FNS) <= set(available_parsers())
    with pytest.raises(KeyError, match="unknown tool-call parser"):
        parse_tool_calls("x", "nope")


def test_each_family_parser_lives_in_a_module_of_its_own():
    """The parsers package holds one module per call-format family; the package namespace still
    exposes each family's function (the import path the rest of trajtune and its users rely on)."""
    modules = {name: fn.__module__ for name, fn in P._PARSERS.items()}
    assert all(m.startswith("trajtune.chat.parsers.") for m in modules.values()), modules
    assert len(set(modules.values())) == len(modules), modules
    for name, fn in PARSER_FNS.items():
        assert P._PARSERS[name] is fn and getattr(P, fn.__name__) is fn


@pytest.mark.parametrize("name", list(VALID))
def test_valid_call_with_nested_quotes_and_unicode(name):
    r = parse_tool_calls(VALID[name], name)
    assert r.errors == []
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("f", {"q": 'say "hi" ☂'})]
    assert r.content == "Sure."
    assert r.tool_calls[0].id  # every call gets an id


@pytest.mark.parametrize("name", list(VALID))
def test_no_parser_raises_on_any_truncation(name):
    text = VALID[name]
    for cut in range(len(text) + 1):
        PARSER_FNS[name](text[:cut])  # the raw function: an exception here would fail the test
        PARSER_FNS[name](text[cut:])
    for junk in ["", " ", "]]]", "{{{", "[TOOL_CALLS]", "<tool_call>", "Action:", "[f(", "\x00", "💥" * 50]:
        assert isinstance(PARSER_FNS[name](junk).errors, list)


@pytest.mark.parametrize("name", list(VALID))
def test_plain_text_is_content_without_errors(name):
    r = parse_tool_calls("The answer is 42 [see notes].", name)
    assert r.tool_calls == [] and r.errors == [] and r.content == "The answer is 42 [see notes]."


@pytest.mark.parametrize("name,text,needle", [
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": 1}', "unterminated"),
    ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}', "invalid JSON"),
    ("llama3_json", '{"name": "f", "parameters": {"a": 1}', "invalid JSON"),
    ("pythonic", "[f(a=1), g(b=", "unterminated"),
    ("react", "Action: f[a b", "unterminated"),
    ("deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1}", "unterminated"),
])
def test_unterminated(name, text, needle):
    r = parse_tool_calls(text, name)
    assert r.tool_calls == []
    assert any(needle in e for e in r.errors), r.errors


@pytest.mark.parametrize("name,text", [
    ("hermes", "<tool_call>{name: f}</tool_call>"),
    ("mistral", "[TOOL_CALLS] [{'name': 'f'}]"),
    ("llama3_json", '{"name": "f", "parameters": {a: 1}}'),
    ("react", "Action: f\nAction Input: {a: 1}"),
    ("deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{a: 1}\n```"
                 "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
])
def test_invalid_json(name, text):
    r = parse_tool_calls(text, name)
    assert r.tool_calls == [] and r.errors and any("JSON" in e for e in r.errors)


@pytest.mark.parametrize("name,text", [
    ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {}}] and then I waited'),
    ("llama3_json", '{"name": "f", "parameters": {}} hope that helps'),
    ("deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```"
                 "<｜tool▁call▁end｜><｜tool▁calls▁end｜>trailing words"),
    ("react", "Action: f[x]\nObservation: it worked"),
])
def test_trailing_text_is_reported_and_calls_kept(name, text):
    r = parse_tool_calls(text, name)
    assert [c.name for c in r.tool_calls] == ["f"]
    assert len(r.errors) == 1


def test_hermes_trailing_text_is_content():
    r = parse_tool_calls('<tool_call>{"name": "f", "arguments": {}}</tool_call>\nDone', "hermes")
    assert r.content == "Done" and r.errors == [] and r.tool_calls[0].arguments == {}


@pytest.mark.parametrize("name,text", [
    ("hermes", "<tool_call>  </tool_call>"),
    ("mistral", "[TOOL_CALLS] []"),
    ("pythonic", "[]"),
    ("deepseek", "<｜tool▁calls▁begin｜><｜tool▁calls▁end｜>"),
])
def test_empty_calls(name, text):
    r = parse_tool_calls(text, name)
    assert r.tool_calls == []
    if name == "pythonic":  # a bare [] is ordinary text, not a call list
        assert r.errors == []
    else:
        assert any("empty" in e for e in r.errors), r.errors


def test_empty_arguments_are_an_empty_dict():
    assert parse_tool_calls("[f()]", "pythonic").tool_calls[0].arguments == {}
    assert parse_tool_calls("Action: f\nAction Input:", "react").tool_calls[0].arguments == {}
    assert parse_tool_calls('{"name": "f", "parameters": {}}', "llama3_json").tool_calls[0].arguments == {}


def test_pythonic_never_evaluates(tmp_path):
    target = tmp_path / "pwned"
    text = f"[f(a=open({str(target)!r}, 'w')), g(b=__import__('os').getcwd())]"
    r = parse_tool_calls(text, "pythonic")
    assert r.tool_calls == [] and len(r.errors) == 2
    assert not target.exists()
    r = parse_tool_calls("[f(*xs)]", "pythonic")
    assert r.tool_calls == [] and r.errors
    r = parse_tool_calls("[f(**kw)]", "pythonic")
    assert r.tool_calls == [] and any("**" in e for e in r.errors)


def test_pythonic_values_and_multiple_calls():
    r = parse_tool_calls('[a.b(x=[1, 2.5, None], y={"k": (1, 2)}, z=true), c(s="]")]', "pythonic")
    assert r.errors == []
    assert [(c.name, c.arguments) for c in r.tool_calls] == [
        ("a.b", {"x": [1, 2.5, None], "y": {"k": (1, 2)}, "z": True}), ("c", {"s": "]"})]
    r = parse_tool_calls("[f(1)]", "pythonic")
    assert r.tool_calls == [] and "positional" in r.errors[0]


def test_react_forms():
    r = parse_tool_calls('Thought: I should search.\nAction: search[{"q": "x"}]', "react")
    assert r.content == "Thought: I should search." and r.tool_calls[0].arguments == {"q": "x"}
    r = parse_tool_calls("Action: lookup[Zürich]", "react")
    assert r.tool_calls[0].arguments == {"input": "Zürich"}
    r = parse_tool_calls("Thought: done\nFinal Answer: 42", "react")
    assert r.tool_calls == [] and r.content == "42"
    r = parse_tool_calls("Action: bad name!\nAction Input: x", "react")
    assert r.tool_calls == [] and "invalid tool name" in r.errors[0]


def test_mistral_forms_and_ids():
    r = parse_tool_calls('[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{}', "mistral")
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("f", {"a": 1}), ("g", {})]
    taken = {"call_000000"}
    r = parse_tool_calls('[TOOL_CALLS] [{"name": "f", "arguments": {}, "id": "a1B2c3D4e"}, {"name": "g", '
                         '"arguments": {}}]', "mistral", taken_ids=taken)
    assert [c.id for c in r.tool_calls] == ["a1B2c3D4e", "call_000001"]
    assert taken == {"call_000000", "a1B2c3D4e", "call_000001"}


def test_llama3_python_tag_and_multiple_calls():
    r = parse_tool_calls('<|python_tag|>{"name": "f", "parameters": {"a": 1}}; {"name": "g", "arguments": {}}',
                         "llama3_json")
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("f", {"a": 1}), ("g", {})] and r.errors == []
    # a JSON answer that is not a call stays content
    r = parse_tool_calls('{"answer": 42}', "llama3_json")
    assert r.tool_calls == [] and r.content == '{"answer": 42}'


def test_double_encoded_arguments_recovered_but_reported():
    r = parse_tool_calls('{"name": "f", "parameters": "{\\"a\\": 1}"}', "llama3_json")
    assert r.tool_calls[0].arguments == {"a": 1} and "double-encoded" in r.errors[0]


def test_reasoning_split():
    assert split_reasoning("<think>\nplan\n</think>\n\nanswer") == ("plan", "answer", [])
    assert split_reasoning("plan</think>answer") == ("plan", "answer", [])
    assert split_reasoning("no thinking") == (None, "no thinking", [])
    assert split_reasoning("<think>forever") == ("forever", "", ["unterminated <think> block"])
    r = parse_tool_calls('<think>maybe <tool_call>{"name": "x", "arguments": {}}</tool_call>?</think>'
                         '<tool_call>{"name": "y", "arguments": {}}</tool_call>', "hermes", reasoning=True)
    assert [c.name for c in r.tool_calls] == ["y"] and r.reasoning.startswith("maybe")


def test_detect_parser():
    from trajtune.models.tiny import CHAT_TEMPLATE

    for fam in FAMILIES.values():
        assert detect_parser(fam.template) == fam.parser, fam.name
    assert detect_parser(CHAT_TEMPLATE) == "hermes"
    assert detect_parser("{% for m in messages %}{{ m.content }}{% endfor %}") is None
    assert detect_parser(None) is None


@pytest.mark.parametrize("name", list(FAMILIES))
def test_parsers_round_trip_what_each_template_renders(name):
    """parse(render(call)) == call, on the policy tokens of every tool-calling assistant turn."""
    fam = FAMILIES[name]
    tok = tokenizer_for(name)
    drops_content = name in ("llama3", "mistral")  # their templates drop an assistant's text beside calls
    traj = conversation(content_with_call=not drops_content)
    r = ChatRenderer(tok, RenderConfig(non_prefix="split"))
    samples = r.render_samples(traj)
    turns: dict[int, list[int]] = {}
    for s in samples:
        for i, src, t in zip(s.ids, s.source, s.turn):
            if src == SOURCE_POLICY:
                turns.setdefault(t, []).append(i)
    assistants = [m for m in traj.messages if m.role == "assistant"]
    n_calls = 0
    for k, m in enumerate(assistants):
        text = tok.decode(turns[k], skip_special_tokens=False)
        assert text.endswith(fam.eot)
        parsed = parse_tool_calls(text[: -len(fam.eot)], fam.parser, reasoning=True)
        assert parsed.errors == []
        assert [(c.name, c.arguments) for c in parsed.tool_calls] == \
            [(c.name, c.arguments) for c in m.tool_calls or []]
        n_calls += len(parsed.tool_calls)
        if m.tool_calls and m.text():
            assert parsed.content == m.text()
        if not m.tool_calls and name != "deepseek":
            assert parsed.content == m.text()
    assert n_calls == 2


# -- the parsers for the new template families ---------------------------------------------------

NEW_PARSERS = ["xml", "glm45", "nemotron", "cohere", "lfm2", "harmony", "gemma4"]


@pytest.mark.parametrize("name", [n for n, f in NEW_FAMILIES.items() if f.parser])
@pytest.mark.parametrize("with_content", [False, True])
def test_new_parsers_round_trip_each_family_turn(name, with_content):
    """parse(EXPECT(turn)) gives back the turn's calls, content and reasoning; EXPECT is the text the
    template itself renders (test_template_fixtures), so this is parse(render(call)) == call."""
    fam = NEW_FAMILIES[name]
    traj = conversation(content_with_call=with_content and name not in ("gpt_oss", "harmony"))  # refused there
    calls = 0
    for m in traj.messages:
        if m.role != "assistant":
            continue
        text = EXPECT[name](m, cohere_ids(traj)) if name == "command_r7b" else EXPECT[name](m)
        end = fam.eot_call if m.tool_calls and fam.eot_call else fam.eot
        r = parse_tool_calls(text[: -len(end)], fam.parser, reasoning=True)
        assert r.errors == []
        assert [(c.name, c.arguments) for c in r.tool_calls] == [(c.name, c.arguments) for c in m.tool_calls or []]
        calls += len(r.tool_calls)
        dropped = m.tool_calls and name in ("command_r7b", "deepseek_r1")  # their templates drop that content
        assert r.content == ("" if dropped else m.text())
        if fam.reasoning_field and not (name in ("command_r7b", "gemma4") and not m.tool_calls):  # beside calls only
            assert r.reasoning == m.reasoning_content
    assert calls == 2


@pytest.mark.parametrize("name", list(NEW_FAMILIES))
def test_detect_parser_on_the_new_fixture_templates(name):
    assert detect_parser(NEW_FAMILIES[name].template) == NEW_FAMILIES[name].parser


def test_detect_parser_ignores_jinja_comments():
    body = "{% for m in messages %}{{ m.content }}{% endfor %}"
    for marker in ("<TOOLCALL>", "<arg_key>", "<function=", "<|START_ACTION|>", "<tool_call>", "tool_code"):
        assert detect_parser("{#- the model writes " + marker + " -#}" + body) is None
        assert detect_parser(body + "{{ '" + marker + "' }}") is not None


@pytest.mark.parametrize("name,text,needle", [
    ("xml", "<tool_call>\n<function=f>\n<parameter=a>\n1", "unterminated <parameter=a>"),
    ("xml", "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n", "unterminated <function=f>"),
    ("xml", "<tool_call>\n<function=f", "unterminated or empty"),
    ("xml", "<tool_call>\n<function=f>\n</function>\nbye", "unterminated <tool_call>"),
    ("glm45", "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1", "unterminated"),
    ("nemotron", '<TOOLCALL>[{"name": "f", "arguments": {"a": 1}', "unterminated"),
    ("cohere", '<|START_ACTION|>[{"tool_name": "f", "parameters": {"a": 1}', "unterminated"),
    ("lfm2", "<|tool_call_start|>[f(a=1)", "unterminated"),
    # complete payloads whose block was cut off before its closing tag
    ("glm45", "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n", "unterminated"),
    ("nemotron", '<TOOLCALL>[{"name": "f", "arguments": {}}]', "unterminated"),
    ("cohere", '<|START_ACTION|>[{"tool_name": "f", "parameters": {}}]', "unterminated"),
    ("lfm2", "<|tool_call_start|>[f(a=1)]", "unterminated"),
    ("gemma4", '<|tool_call>call:f{a:<|"|>x<|"|>}', "unterminated"),
    ("harmony", "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant to=functions.f<|channel|>commentary",
     "without <|message|>"),
])
def test_new_parsers_report_unterminated_blocks(name, text, needle):
    r = parse_tool_calls(text, name)
    assert any(needle in e for e in r.errors), r.errors
    assert r.tool_calls == []  # a cut-off call is never executed


@pytest.mark.parametrize("name,text", [
    ("nemotron", "<TOOLCALL>[{name: f}]</TOOLCALL>"),
    ("cohere", "<|START_ACTION|>[{tool_name: f}]<|END_ACTION|>"),
    ("lfm2", '<|tool_call_start|>[{"name": f}]<|tool_call_end|>'),
    ("harmony", "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{a: 1}<|call|>"),
])
def test_new_parsers_report_invalid_json(name, text):
    r = parse_tool_calls(text, name)
    assert r.tool_calls == [] and any("JSON" in e for e in r.errors), r.errors


@pytest.mark.parametrize("name", NEW_PARSERS)
def test_new_parsers_survive_junk(name):
    for junk in ["<tool_call><tool_call></tool_call>", "<function=>", "<function=f><parameter=>", "<arg_key>",
                 "<|start|><|start|><|message|>", "<|channel|><|channel|>", "<TOOLCALL></TOOLCALL>",
                 "<|START_ACTION|><|END_ACTION|>", "<|tool_call_start|><|tool_call_end|>", "[" * 200,
                 '<TOOLCALL>[{"name": "f", "arguments": ' + "[" * 5000 + "]" * 5000 + "}]</TOOLCALL>"]:
        r = PARSER_FNS[name](junk)
        assert isinstance(r.errors, list)


def test_xml_and_glm_values_decode_json_non_strings_only():
    """The templates write strings raw and everything else as JSON; reading back is ambiguous for a
    string that looks like JSON, which comes back decoded (documented in _scalar_or_text)."""
    f = P._scalar_or_text
    assert [f("42"), f("-2.5"), f("true"), f("null"), f('{"a": [1]}'), f("[1, \"x\"]")] == \
        [42, -2.5, True, None, {"a": [1]}, [1, "x"]]
    assert [f("Zürich"), f('"quoted"'), f(""), f("True"), f("{a: 1}")] == ["Zürich", '"quoted"', "", "True", "{a: 1}"]
    text = ("<function=f>\n<parameter=code>\n\nline 1\n  line 2\n\n</parameter>\n<parameter=n>\n3\n</parameter>\n"
            "</function>")
    r = parse_tool_calls(text, "xml")
    assert r.errors == [] and r.tool_calls[0].arguments == {"code": "\nline 1\n  line 2\n", "n": 3}


def test_xml_forms_and_errors():
    two = ("<tool_call>\n<function=a.b>\n</function>\n</tool_call>\n<tool_call>\n<function=c>\n<parameter=x>\n"
           "1\n</parameter>\n</function>\n</tool_call>")
    r = parse_tool_calls(two, "xml")
    assert r.errors == [] and [(c.name, c.arguments) for c in r.tool_calls] == [("a.b", {}), ("c", {"x": 1})]
    bare = parse_tool_calls("<function=f>\n<parameter=x>\ny\n</parameter>\n</function>", "xml")
    assert bare.errors == [] and bare.tool_calls[0].arguments == {"x": "y"}
    for text, needle in [
        ("<function=f>\n<parameter=x>\n1\n</parameter>\n<parameter=x>\n2\n</parameter>\n</function>", "duplicate"),
        ("<function=f>\nx=1\n</function>", "text outside <parameter"),
        ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', "stray <tool_call>"),
    ]:
        r = parse_tool_calls(text, "xml")
        assert r.tool_calls == [] and any(needle in e for e in r.errors), (text, r.errors)


def test_glm45_forms_and_errors():
    r = parse_tool_calls("<tool_call>f\n</tool_call><tool_call>g\n<arg_key>a</arg_key>\n<arg_value>[1]</arg_value>\n"
                         "</tool_call>", "glm45")
    assert r.errors == [] and [(c.name, c.arguments) for c in r.tool_calls] == [("f", {}), ("g", {"a": [1]})]
    for text in ['<tool_call>{"name": "f"}</tool_call>', "<tool_call>f\n<arg_key>a</arg_key>junk</tool_call>",
                 "<tool_call>f\n<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>a</arg_key><arg_value>2"
                 "</arg_value></tool_call>",
                 "<tool_call>\n</tool_call>"]:
        r = parse_tool_calls(text, "glm45")
        assert r.tool_calls == [] and r.errors, text


def test_nemotron_forms_and_errors():
    r = parse_tool_calls('<TOOLCALL>[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"a": 1}}]'
                         "</TOOLCALL> and more", "nemotron")
    assert [c.name for c in r.tool_calls] == ["f", "g"] and r.errors == ["text after </TOOLCALL>: 'and more'"]
    r = parse_tool_calls('<TOOLCALL>[{"name": "f", "arguments": "{\\"a\\": 1}"}]</TOOLCALL>', "nemotron")
    assert r.tool_calls[0].arguments == {"a": 1} and "double-encoded" in r.errors[0]
    assert parse_tool_calls("<TOOLCALL>[]</TOOLCALL>", "nemotron").errors == \
        ["tool call: expected a non-empty JSON list of calls"]


def test_cohere_forms_and_errors():
    text = ('<|START_THINKING|>Plan.<|END_THINKING|><|START_ACTION|>[{"tool_call_id": "3", "tool_name": "f", '
            '"parameters": {"a": 1}}]<|END_ACTION|>')
    r = parse_tool_calls(text, "cohere", taken_ids=set())
    assert r.errors == [] and r.reasoning == "Plan." and r.tool_calls[0].id == "3" and r.content == ""
    r = parse_tool_calls("<|START_RESPONSE|>Hi.<|END_RESPONSE|> trailing", "cohere")
    assert r.content == "Hi." and r.errors == ["text outside the response block: 'trailing'"]
    r = parse_tool_calls('<|START_ACTION|>{"tool_name": "f", "parameters": {}}<|END_ACTION|>', "cohere")
    assert [c.name for c in r.tool_calls] == ["f"] and "one object" in r.errors[0]
    r = parse_tool_calls("<|START_RESPONSE|>a<|END_RESPONSE|><|START_RESPONSE|>b<|END_RESPONSE|>", "cohere")
    assert any("more than one" in e for e in r.errors)


def test_lfm2_forms_and_never_evaluates(tmp_path):
    r = parse_tool_calls('<|tool_call_start|>[f(a=1)]<|tool_call_end|>x<|tool_call_start|>[{"name": "g", '
                         '"arguments": {"b": true}}]<|tool_call_end|>', "lfm2")
    assert r.errors == [] and [(c.name, c.arguments) for c in r.tool_calls] == [("f", {"a": 1}), ("g", {"b": True})]
    assert r.content == "x"
    target = tmp_path / "pwned"
    r = parse_tool_calls(f"<|tool_call_start|>[f(a=open({str(target)!r}, 'w'))]<|tool_call_end|>", "lfm2")
    assert r.tool_calls == [] and r.errors and not target.exists()
    r = parse_tool_calls("<|tool_call_start|>calling [f(a=1)]<|tool_call_end|>", "lfm2")
    assert [c.name for c in r.tool_calls] == ["f"] and "text inside the call block" in r.errors[0]
    assert parse_tool_calls("[f(a=1)]", "lfm2").tool_calls == []  # only inside the markers


def test_harmony_forms_and_errors():
    # as the model writes it: recipient after the channel, <|constrain|> before the body
    text = ("<|channel|>analysis<|message|>Need the time.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_time <|constrain|>json<|message|>{"tz": "UTC"}')
    r = parse_tool_calls(text, "harmony", reasoning=True)
    assert r.errors == [] and r.reasoning == "Need the time." and r.tool_calls[0].name == "get_time"
    assert r.tool_calls[0].arguments == {"tz": "UTC"}
    r = parse_tool_calls("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b"
                         "<|end|><|start|>assistant<|channel|>final<|message|>Done.", "harmony")
    assert r.errors == [] and r.reasoning == "a\nb" and r.content == "Done." and r.tool_calls == []
    r = parse_tool_calls('<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>'
                         '<|start|>functions.f to=assistant<|channel|>commentary<|message|>"made up"<|end|>', "harmony")
    assert [c.name for c in r.tool_calls] == ["f"] and "as 'functions.f'" in r.errors[0]
    r = parse_tool_calls("<|channel|>final<|message|>a<|start|>assistant<|channel|>final<|message|>b", "harmony")
    assert "not closed" in r.errors[0]
    assert parse_tool_calls("plain <b>text</b>", "harmony").content == "plain <b>text</b>"


def test_gemma4_reads_every_value_kind_the_template_writes():
    """Gemma 4's format_argument: <|"|>strings<|"|> (unescaped: quotes, braces, commas inside),
    true/false, bare numbers, null (None in older templates), {bare:keys}, [lists]."""
    q = '<|"|>'
    text = ("Checking.<|tool_call>call:create_reminder{at:{hour:8,minute:30},"
            f"note:{q}say \"hi\", {{then}} [go] ☂{q},n:-12,ratio:2.5e-3,tags:[{q}rain{q},{q}déjà vu{q}],"
            f"urgent:true,quiet:false,gone:null,old:None,rows:[{{a:1}},{{a:[]}}],empty:{{}}}}<tool_call|>"
            f"<|tool_call>call:get_weather{{city:{q}Zürich{q}}}<tool_call|>")
    r = parse_tool_calls(text, "gemma4")
    assert r.errors == [] and r.content == "Checking."
    assert [(c.name, c.arguments) for c in r.tool_calls] == [
        ("create_reminder", {"at": {"hour": 8, "minute": 30}, "note": 'say "hi", {then} [go] ☂', "n": -12,
                             "ratio": 0.0025, "tags": ["rain", "déjà vu"], "urgent": True, "quiet": False,
                             "gone": None, "old": None, "rows": [{"a": 1}, {"a": []}], "empty": {}}),
        ("get_weather", {"city": "Zürich"})]
    assert type(r.tool_calls[0].arguments["n"]) is int and type(r.tool_calls[0].arguments["ratio"]) is float
    # keys and strings the way models also write them: quoted, JSON strings, spaces after separators
    r = parse_tool_calls('<|tool_call>call:f{<|"|>k<|"|>: "a \\"b\\"", "n": [1, 2]}<tool_call|>', "gemma4")
    assert r.errors == [] and r.tool_calls[0].arguments == {"k": 'a "b"', "n": [1, 2]}
    # a thought block is reasoning, not content; names may hold dots and dashes
    r = parse_tool_calls("<|channel>thought\nNeed the shell.\n<channel|><|tool_call>call:tools.shell-exec{}"
                         "<tool_call|>", "gemma4")
    assert r.errors == [] and r.reasoning == "Need the shell." and r.content == ""
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("tools.shell-exec", {})]


@pytest.mark.parametrize("body,needle", [
    ("call:f{a:}", "expected a value"),
    ("call:f{a:1,}", "expected a key"),
    ("call:f{a 1}", "expected ':'"),
    ("call:f{a:1 b:2}", "expected ',' or '}'"),
    ("call:f{a:[1 2]}", "expected ',' or ']'"),
    ('call:f{a:<|"|>open}', 'unterminated <|"|> string'),
    ('call:f{a:"open}', "invalid JSON string"),
    ("call:f{a:1,a:2}", "duplicate key 'a'"),
    ("call:f{a:truex}", "expected a value"),
    ("call:f{a:nan}", "expected a value"),
    ("call:f{a:__import__('os')}", "expected a value"),
    ("call:f{a:1}}", "text after the arguments"),
    ("f{a:1}", "expected call:NAME{…}"),
    ("call:bad name{a:1}", "expected call:NAME{…}"),
])
def test_gemma4_malformed_calls_are_reported_and_not_executed(body, needle):
    r = parse_tool_calls(f"Hi<|tool_call>{body}<tool_call|><|tool_call>call:ok{{}}<tool_call|>", "gemma4")
    assert len(r.errors) == 1 and r.errors[0].startswith("tool call 0: ") and needle in r.errors[0], r.errors
    assert [c.name for c in r.tool_calls] == ["ok"] and r.content == "Hi"  # the next call is still read


def test_gemma4_stray_and_unterminated_markers():
    r = parse_tool_calls("done<tool_call|>", "gemma4")
    assert r.tool_calls == [] and "stray <tool_call|>" in r.errors[0]
    r = parse_tool_calls("<|channel>thought\nhmm", "gemma4")
    assert r.reasoning == "hmm" and "unterminated <|channel>" in r.errors[0]
    assert parse_tool_calls("call:f{a:1}", "gemma4").tool_calls == []  # only inside the markers


def test_parse_tool_calls_keeps_reasoning_the_parser_read():
    text = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi."
    assert parse_tool_calls(text, "harmony").reasoning == "Think."
    assert parse_tool_calls(text, "harmony", reasoning=True).reasoning == "Think."
    assert parse_tool_calls("<think>t</think><|START_RESPONSE|>x<|END_RESPONSE|>", "cohere",
                            reasoning=True).reasoning == "t"


def test_pythonic_parses_once_on_a_bracket_storm(monkeypatch):
    """``[f(a='`` followed by 40 000 ``]`` took 12.6 s: ast.parse was tried at every ``]``. The call
    list is now delimited in one pass, so ast.parse runs at most once whatever the input."""
    import ast

    calls = []
    real = ast.parse
    monkeypatch.setattr(ast, "parse", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    r = P.parse_pythonic("[f(a='" + "]" * 40000)
    assert r.tool_calls == [] and r.errors == ["unterminated or invalid call list"]
    assert len(calls) <= 1
    calls.clear()
    r = P.parse_pythonic('x [f(a="]", b=\'\'\'[\n]\'\'\', c=[1, {"k": "\\"]"}]),  # ]\n g()] y')
    assert len(calls) == 1 and r.errors == []
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("f", {"a": "]", "b": "[\n]", "c": [1, {"k": '"]'}]}),
                                                             ("g", {})]
    assert r.content == "x  y"


def test_pythonic_refuses_values_json_cannot_store():
    r = parse_tool_calls("[f(a={1, 2}), g(b=b'x'), h(c=1j), k(d=-1.5, e=None)]", "pythonic")
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("k", {"d": -1.5, "e": None})]
    assert len(r.errors) == 3 and all("not a literal value" in e for e in r.errors)


def test_pythonic_raw_text_of_many_calls():
    r = parse_tool_calls("[" + ", ".join(f"f(i={i}, s='é{i}')" for i in range(300)) + "]", "pythonic")
    assert [c.arguments_raw for c in r.tool_calls] == [f"f(i={i}, s='é{i}')" for i in range(300)]


def test_hermes_single_quoted_call_is_parsed_and_reported():
    r = parse_tool_calls("<tool_call>{'name': 'f', 'arguments': {'a': 1, 'b': [True, None]}}</tool_call>", "hermes")
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("f", {"a": 1, "b": [True, None]})]
    assert len(r.errors) == 1 and "not strict JSON" in r.errors[0]
    r = parse_tool_calls("<tool_call>{'name': open('x')}</tool_call>", "hermes")  # never evaluated
    assert r.tool_calls == [] and "invalid JSON" in r.errors[0]


@pytest.mark.parametrize("name", list(VALID))
def test_arguments_nested_too_deep_are_a_format_error_not_a_crash(name):
    from trajtune.schema import MAX_VALUE_DEPTH

    for depth in (MAX_VALUE_DEPTH + 5, 2000):
        deep = '{"a": ' * depth + "1" + "}" * depth
        text = {"hermes": f'<tool_call>{{"name": "f", "arguments": {deep}}}</tool_call>',
                "mistral": f'[TOOL_CALLS] [{{"name": "f", "arguments": {deep}}}]',
                "llama3_json": f'{{"name": "f", "parameters": {deep}}}',
                "pythonic": "[f(a=" + "[" * depth + "]" * depth + ")]",
                "react": f"Action: f\nAction Input: {deep}",
                "deepseek": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n"
                            f"{deep}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                "xml": f"<tool_call>\n<function=f>\n<parameter=a>\n{deep}\n</parameter>\n</function>\n</tool_call>",
                "glm45": f"<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>{deep}</arg_value>\n</tool_call>",
                "nemotron": f'<TOOLCALL>[{{"name": "f", "arguments": {deep}}}]</TOOLCALL>',
                "cohere": f'<|START_ACTION|>[{{"tool_call_id": "0", "tool_name": "f", "parameters": {deep}}}]'
                          "<|END_ACTION|>",
                "lfm2": "<|tool_call_start|>[f(a=" + "[" * depth + "]" * depth + ")]<|tool_call_end|>",
                "harmony": f" to=functions.f<|channel|>commentary json<|message|>{deep}",
                "gemma4": "<|tool_call>call:f{" + "a:{" * depth + "a:1" + "}" * depth + "}<tool_call|>"}[name]
        PARSER_FNS[name](text)  # the raw parser: no RecursionError escapes
        r = parse_tool_calls(text, name)
        assert r.tool_calls == [] and r.errors, (name, depth)


def test_a_call_that_does_not_parse_keeps_the_models_text():
    from trajtune.chat.parsers import assistant_message

    text = 'Sure.\n<tool_call>{"name": "f", "arguments": {"a" 1}}</tool_call>'
    p = parse_tool_calls(text, "hermes")
    m = assistant_message(p.content, p.tool_calls, p.errors, text)
    assert p.errors and m.tool_calls is None and m.content == "Sure."
    assert m.extra == {"parse_errors": p.errors, "raw_text": text}  # the broken call can be read, not only counted
    ok = parse_tool_calls('<tool_call>{"name": "f", "arguments": {}}</tool_call>', "hermes")
    assert assistant_message(ok.content, ok.tool_calls, ok.errors, "x").extra == {}


def test_marked_blocks_yields_each_block_and_keeps_the_text_around_them() -> None:
    from trajtune.chat.parsers.base import marked_blocks

    content: list[str] = []
    blocks = list(marked_blocks("a<x>b</x>c<x>d", "<x>", "</x>", content))
    assert blocks == [("tool call 0", "b", True), ("tool call 1", "d", False)]  # the cut-off block runs to the end
    assert content == ["a", "c", ""]
    content = []
    assert list(marked_blocks("no blocks </x>", "<x>", "</x>", content, "call block")) == []
    assert content == ["no blocks </x>"]  # a stray close is the caller's to report
