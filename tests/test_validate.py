"""Validator: every docs/formats.md rule fires with the right id, location and hint; bad input never crashes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trajtune.schema import CodeAction, ImagePart, Message, ToolCall, ToolSpec, Trajectory
from trajtune.validate import RULES, Finding, has_errors, schema_violations, validate_file, validate_trajectory

FIX = Path(__file__).parent / "fixtures" / "formats"


def ok_openai(i: int = 0, **kw) -> dict:
    rec = {"id": f"r{i}", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "assistant", "content": "done"}]}
    rec.update(kw)
    return rec


def write(tmp_path: Path, name: str, data: bytes | str) -> Path:
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return p


def rules_of(findings: list[Finding]) -> set[str]:
    return {f.rule for f in findings}


def line(obj) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


# ------------------------------------------------------------------ catalogue


def test_rule_catalogue_covers_formats_md():
    expected = {  # docs/formats.md "Validation rules", with the severities it gives
        "E201": "E", "E202": "E", "E203": "E", "E204": "E", "E205": "E", "E206": "E", "E207": "E", "W208": "W",
        "E210": "E",
        "E211": "E", "E212": "E", "W213": "W", "E214": "E", "W215": "W", "E220": "E", "E221": "E", "W222": "W",
        "W223": "W", "W224": "W", "E230": "E", "E231": "E", "E240": "E", "W250": "W", "W251": "W", "W252": "W",
    }
    for rid, sev in expected.items():
        assert rid in RULES and RULES[rid].severity == sev and RULES[rid].hint


def test_clean_file_has_no_findings(tmp_path):
    p = write(tmp_path, "ok.jsonl", line(ok_openai(0)) + line(ok_openai(1)))
    assert validate_file(p) == []


# ------------------------------------------------------------------ bad-input corpus (files)

CORPUS = {
    # name: (file bytes, format, expected rule, expected line)
    "malformed_json": (line(ok_openai(0)) + '{"messages": [}\n', None, "E101", 2),
    "not_object": ('[1, 2]\n', None, "E105", 1),
    "wrong_type_content": (line(ok_openai(0, messages=[{"role": "user", "content": 7}])), "openai", "E204", 1),
    "wrong_type_role": (line({"messages": [{"role": 3, "content": "x"}]}), "openai", "E203", 1),
    "ir_empty_id": (line({"schema_version": "1.0", "id": "", "messages": []}), "ir", "E201", 1),
    "ir_bad_version": (line({"schema_version": "9.9", "id": "a", "messages": []}), "ir", "E202", 1),
    "ir_wrong_type": (line({"schema_version": "1.0", "id": "a", "messages": "x"}), "ir", "E111", 1),
    "unmatched_call_id": (line(ok_openai(0, messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c9", "content": "?"}, {"role": "assistant", "content": "x"}])), None, "E211", 1),
    "duplicate_call_id": (line(ok_openai(0, messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                                             {"id": "c1", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a"}, {"role": "assistant", "content": "x"}])), None, "E210", 1),
    "double_encoded": (line(ok_openai(0, messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "f", "arguments": json.dumps(json.dumps({"x": 1}))}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a"}, {"role": "assistant", "content": "x"}])), None, "W222", 1),
    "invalid_utf8": (b'{"id": "a", "messages": [{"role": "user", "content": "caf\xe9"}]}\n' + line(ok_openai(1)).encode(),
                     None, "E103", 1),
    "truncated_last_line": (line(ok_openai(0)) + '{"id": "r1", "messages": [{"role": "user", "content": "hel', None, "E102", 2),
    "empty_file": ("", None, "E104", None),
    "bom": (b"\xef\xbb\xbf" + line(ok_openai(0)).encode(), None, "W108", 1),
    "lone_surrogate": ('{"id": "s", "messages": [{"role": "user", "content": "bad \\ud800 x"}, '
                       '{"role": "assistant", "content": "y"}]}\n', None, "E240", 1),
    "unknown_format": (line({"foo": 1}), None, "E107", 1),
    "adp_unknown_class": (line({"id": "a", "content": [{"class_": "teleport"}]}), "adp", "E111", 1),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_bad_input_corpus(tmp_path, name):
    data, fmt, rule, lineno = CORPUS[name]
    p = write(tmp_path, f"{name}.jsonl", data)
    findings = validate_file(p, fmt)
    hit = [f for f in findings if f.rule == rule]
    assert hit, f"{name}: expected {rule}, got {[str(f) for f in findings]}"
    f = hit[0]
    assert f.file == str(p) and f.line == lineno and f.hint
    assert f.severity == rule[0]


def test_findings_name_trajectory_and_message(tmp_path):
    p = write(tmp_path, "x.jsonl", CORPUS["unmatched_call_id"][0])
    (f,) = [f for f in validate_file(p) if f.rule == "E211"]
    assert (f.trajectory_id, f.message_index) == ("r0", 2)
    assert "c9" in f.message
    d = f.to_dict()
    assert {"file", "line", "trajectory_id", "message_index", "rule", "severity", "hint", "name"} <= set(d)


def test_bad_line_does_not_stop_the_file(tmp_path):
    data = CORPUS["invalid_utf8"][0] + b"{oops\n" + line(ok_openai(2)).encode()
    p = write(tmp_path, "m.jsonl", data)
    stats: dict = {}
    from trajtune.validate import iter_findings

    found = list(iter_findings(p, stats=stats))
    assert [(f.rule, f.line) for f in found] == [("E103", 1), ("E101", 3)]
    assert stats == {"records": 4, "valid": 2}


def test_bom_record_still_valid(tmp_path):
    p = write(tmp_path, "b.jsonl", CORPUS["bom"][0])
    assert [f.rule for f in validate_file(p)] == ["W108"]


def test_fifty_megabyte_line_is_rejected_with_bounded_memory(tmp_path):
    import resource

    big = tmp_path / "big.jsonl"
    with big.open("w") as f:
        f.write(line(ok_openai(0)))
        f.write('{"id": "huge", "messages": [{"role": "user", "content": "')
        chunk = "x" * (1024 * 1024)
        for _ in range(50):
            f.write(chunk)
        f.write('"}]}\n')
        f.write(line(ok_openai(2)))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    findings = validate_file(big)
    grew_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert [(f.rule, f.line) for f in findings] == [("E106", 2)]
    assert grew_kib < 45 * 1024  # the 50 MB line was never held whole (chunks stop at the 32 MiB limit)


# ------------------------------------------------------------------ trajectory rules


def traj(*messages: Message, tools: list[ToolSpec] | None = None) -> Trajectory:
    return Trajectory(id="t", messages=list(messages), tools=tools or [])


def call(cid="c1", name="f", **kw) -> ToolCall:
    kw.setdefault("arguments", {})
    return ToolCall(id=cid, name=name, **kw)


U = Message(role="user", content="q")
A_END = Message(role="assistant", content="done")


def test_role_field_rules():
    t = traj(Message(role="user", content="q", tool_calls=[call()], thought="x", tool_call_id="c1", train=True),
             Message(role="system", content=None), A_END)
    r = rules_of(validate_trajectory(t))
    assert {"E205", "E206", "E207", "W250", "E204"} <= r


def test_content_type_for_role():
    t = traj(Message(role="system", content=[ImagePart(url="http://x/a.png")]), U,
             Message(role="assistant", content=None), A_END)
    found = validate_trajectory(t)
    assert [(f.rule, f.message_index) for f in found if f.rule == "E204"] == [("E204", 0), ("E204", 2)]


def test_unanswered_vs_final_finish():
    t = traj(U, Message(role="assistant", tool_calls=[call("c1", "lookup")]), A_END,
             Message(role="assistant", tool_calls=[call("c2", "finish")]))
    found = {(f.rule, f.message_index) for f in validate_trajectory(t)}
    assert ("E212", 1) in found and ("W213", 3) in found
    # a trajectory ending on a (non-finish) call is the single-turn function-calling shape: valid
    t2 = traj(U, Message(role="assistant", tool_calls=[call("c1", "lookup")]))
    assert validate_trajectory(t2) == []
    # ...but a result missing in the middle stays an error, also when it is the last assistant turn
    t3 = traj(U, Message(role="assistant", tool_calls=[call("c1", "lookup")]), U)
    assert ("E212", 1) in {(f.rule, f.message_index) for f in validate_trajectory(t3)}


def test_answered_twice_and_order():
    a = Message(role="assistant", tool_calls=[call("c1"), call("c2")])
    t = traj(U, a, Message(role="tool", tool_call_id="c2", content="2"), Message(role="tool", tool_call_id="c1", content="1"),
             Message(role="tool", tool_call_id="c1", content="again"), A_END)
    found = validate_trajectory(t)
    assert "E214" in rules_of(found)
    order = [f for f in found if f.rule == "W215"]
    assert order and order[0].severity == "W"
    strict = [f for f in validate_trajectory(t, export_format="openai") if f.rule == "W215"]
    assert strict[0].severity == "E"
    in_order = traj(U, a, Message(role="tool", tool_call_id="c1", content="1"),
                    Message(role="tool", tool_call_id="c2", content="2"), A_END)
    assert validate_trajectory(in_order) == []


def test_argument_rules():
    t = traj(U, Message(role="assistant", tool_calls=[
        call("c1", arguments={"x": float("nan")}),
        call("c2", arguments={"a": 1}, arguments_raw='{"a": 2}'),
        call("c3", arguments=None, arguments_raw="[1, 2]"),
        call("c4", arguments={"arguments": '{"x": 1}'}),
        call("c5", arguments=None),
    ]), *[Message(role="tool", tool_call_id=f"c{i}", content="r") for i in range(1, 6)], A_END)
    found = {(f.rule, f.message.split(" ")[1]) for f in validate_trajectory(t)}
    assert {("E220", "c1"), ("E221", "c2"), ("E220", "c3"), ("W222", "c4"), ("E220", "c5")} <= found


def test_schema_and_declared_tools():
    spec = ToolSpec(name="book", parameters={
        "type": "object", "additionalProperties": False, "required": ["n"],
        "properties": {"n": {"type": "integer"}, "kind": {"type": "string", "enum": ["a", "b"]}}})
    t = traj(U, Message(role="assistant", tool_calls=[
        call("c1", "book", arguments={"n": "2", "kind": "z", "extra": 1}),
        call("c2", "book", arguments={}),
        call("c3", "undeclared"),
        call("c4", "finish"),
    ]), *[Message(role="tool", tool_call_id=f"c{i}", content="r") for i in range(1, 5)], A_END, tools=[spec])
    found = validate_trajectory(t)
    w223 = [f.message for f in found if f.rule == "W223"]
    assert any("expected integer" in m and "not in enum" in m and "unknown key 'extra'" in m for m in w223)
    assert any("missing required 'n'" in m for m in w223)
    assert [f.message for f in found if f.rule == "W224"] == ["call c3: tool 'undeclared' is not declared in tools"]


def test_schema_violations_subset():
    s = {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "number"}}, "b": {"type": "boolean"}}}
    assert schema_violations({"xs": [1, 2.5], "b": True}, s) == []
    assert schema_violations({"xs": [1, "2"], "b": 1}, s) == ["arguments.xs[1]: expected number, got str",
                                                             "arguments.b: expected boolean, got int"]


def test_code_and_image_rules():
    t = traj(U, Message(role="user", content=[ImagePart(url="u", path="p"), ImagePart()]),
             Message(role="assistant", tool_calls=[call("c1", "run", code=CodeAction(language="", source="x"))]),
             Message(role="tool", tool_call_id="c1", content="r"), A_END)
    found = [(f.rule, f.message_index) for f in validate_trajectory(t)]
    assert found.count(("E231", 1)) == 2 and ("E230", 2) in found


def test_think_and_sft_end():
    t = traj(U, Message(role="assistant", content="<think>hmm"), U)
    r = rules_of(validate_trajectory(t))
    assert {"W251", "W252"} <= r
    assert "W252" not in rules_of(validate_trajectory(t, sft=False))
    assert [f.message for f in validate_trajectory(traj())] == ["trajectory has no messages"]


def test_has_errors_strict():
    w = Finding(rule="W252", severity="W", message="m", hint="h")
    assert not has_errors([w]) and has_errors([w], strict=True)


def test_converter_warnings_surface(tmp_path):
    p = FIX / "hermes.jsonl"
    found = validate_file(p)
    assert [f.rule for f in found if f.line == 2].count("W109") == 2


def test_surrogates_in_built_trajectories():
    t = traj(Message(role="user", content="bad \ud800"), A_END)
    (f,) = [f for f in validate_trajectory(t) if f.rule == "E240"]
    assert "messages[0].content" in f.message
