"""The IR: validation, JSONL errors that name the line, deterministic call ids, atomic writes."""

from __future__ import annotations

import json

import pytest

from trajtune.schema import (
    AtomicJsonlWriter,
    Message,
    RecordError,
    ToolCall,
    Trajectory,
    generate_call_ids,
    load_trajectories,
    write_trajectories,
)


def _traj(i: int) -> Trajectory:
    return Trajectory(id=f"t{i}", messages=[
        Message(role="user", content="hi ü"),
        Message(role="assistant", tool_calls=[ToolCall(id="", name="f", arguments={"a": i})]),
        Message(role="tool", tool_call_id="", content="ok"),
    ])


def test_round_trip_through_jsonl(tmp_path):
    trajs = [generate_call_ids(_traj(i)) for i in range(3)]
    p = tmp_path / "x.jsonl"
    assert write_trajectories(p, trajs) == 3
    back = load_trajectories(p)
    assert [t.model_dump() for t in back] == [t.model_dump() for t in trajs]


def test_generated_ids_are_deterministic_and_skip_collisions():
    t = Trajectory(id="x", messages=[Message(role="assistant", tool_calls=[
        ToolCall(id="", name="a"), ToolCall(id="call_000001", name="b"), ToolCall(id="", name="c")])])
    generate_call_ids(t)
    ids = [c.id for c in t.messages[0].tool_calls]
    assert ids == ["call_000000", "call_000001", "call_000002"]
    assert [c.id_generated for c in t.messages[0].tool_calls] == [True, False, True]


@pytest.mark.parametrize("line,rule,needle", [
    ('{"id": "a", "messages": [', "json", "invalid JSON"),
    ('[1, 2]', "json_object", "expected a JSON object"),
    ('{"id": "", "messages": []}', "schema", "non-empty"),
    ('{"id": "a", "messages": [{"role": "robot", "content": "x"}]}', "schema", "messages.0.role"),
    ('{"id": "a", "mesages": []}', "schema", "mesages"),
    ('{"id": "a", "schema_version": "9.9"}', "schema", "not supported"),
])
def test_bad_lines_name_file_line_and_rule(tmp_path, line, rule, needle):
    p = tmp_path / "bad.jsonl"
    good = json.dumps(_traj(0).model_dump(mode="json"))
    p.write_text(good + "\n\n" + line + "\n")
    with pytest.raises(RecordError) as e:
        load_trajectories(p)
    assert e.value.line == 3 and e.value.rule == rule
    assert "bad.jsonl:3" in str(e.value) and needle in str(e.value)


def test_invalid_utf8_and_bom(tmp_path):
    p = tmp_path / "u.jsonl"
    good = json.dumps(_traj(0).model_dump(mode="json")).encode()
    p.write_bytes(b"\xef\xbb\xbf" + good + b"\n" + b'{"id": "\xff"}\n')
    with pytest.raises(RecordError) as e:
        load_trajectories(p)
    assert e.value.line == 2 and e.value.rule == "utf8"


def test_atomic_writer_never_clobbers_or_half_writes(tmp_path):
    p = tmp_path / "out.jsonl"
    p.write_text("precious\n")
    with pytest.raises(FileExistsError, match="--overwrite"):
        AtomicJsonlWriter(p)
    with pytest.raises(RuntimeError):
        with AtomicJsonlWriter(p, overwrite=True) as w:
            w.write(_traj(1))
            raise RuntimeError("killed mid-write")
    assert p.read_text() == "precious\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.jsonl"]  # no temp file left
    write_trajectories(p, [_traj(2)], overwrite=True)
    assert load_trajectories(p)[0].id == "t2"
