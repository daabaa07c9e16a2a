"""Tool-call parsers: calls and errors from model text, never an exception, never evaluation."""

from __future__ import annotations

import pytest
from chat_fixtures import FAMILIES, conversation, tokenizer_for

from trajtune.chat import parsers as P
from trajtune.chat.parsers import available_parsers, detect_parser, parse_tool_calls, split_reasoning
from trajtune.chat.render import SOURCE_POLICY, ChatRenderer, RenderConfig

PARSER_FNS = {"hermes": P.parse_hermes, "mistral": P.parse_mistral, "llama3_json": P.parse_llama3_json,
              "pythonic": P.parse_pythonic, "react": P.parse_react, "deepseek": P.parse_deepseek}

VALID = {
    "hermes": 'Sure.\n<tool_call>\n{"name": "f", "arguments": {"q": "say \\"hi\\" ☂"}}\n</tool_call>',
    "mistral": 'Sure.[TOOL_CALLS] [{"name": "f", "arguments": {"q": "say \\"hi\\" ☂"}, "id": "a1B2c3D4e"}]',
    "llama3_json": 'Sure. {"name": "f", "parameters": {"q": "say \\"hi\\" ☂"}}',
    "pythonic": 'Sure.\n```tool_code\n[f(q="say \\"hi\\" ☂")]\n```',
    "react": 'Sure.\nAction: f\nAction Input: {"q": "say \\"hi\\" ☂"}',
    "deepseek": 'Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n'
                '{"q": "say \\"hi\\" ☂"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
}


def test_all_parsers_registered():
    assert set(PARSER_FNS) <= set(available_parsers())
    with pytest.raises(KeyError, match="unknown tool-call parser"):
        parse_tool_calls("x", "nope")


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
    traj = conversation(content_with_call=True)
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
        if m.tool_calls and m.text() and name not in ("llama3", "mistral"):  # those drop content with calls
            assert parsed.content == m.text()
        if not m.tool_calls and name != "deepseek":
            assert parsed.content == m.text()
    assert n_calls == 2


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
                            f"{deep}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"}[name]
        PARSER_FNS[name](text)  # the raw parser: no RecursionError escapes
        r = parse_tool_calls(text, name)
        assert r.tool_calls == [] and r.errors, (name, depth)
