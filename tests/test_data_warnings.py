"""Every command that reads records reports what `data validate` would: duplicate ids, double-encoded
arguments, and an empty input (an error, before an empty output is written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trajtune.cli.main import app
from trajtune.errors import DataError
from trajtune.validate import iter_findings

runner = CliRunner()


def record(rid: str, arguments: str = '{"x": 1}') -> str:
    return json.dumps({"id": rid, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "assistant", "content": "done"}]}) + "\n"


@pytest.fixture()
def messy(tmp_path: Path) -> Path:
    p = tmp_path / "messy.jsonl"  # ids a, b, a, c, b: lines 3 and 5 repeat; line 4 double-encodes
    p.write_text(record("a") + record("b") + record("a") + record("c", json.dumps(json.dumps({"x": 1})))
                 + record("b"))
    return p


def test_validate_names_the_line_that_used_an_id_first(messy: Path) -> None:
    dup = [f for f in iter_findings(messy) if f.rule == "W208"]
    assert [(f.line, f.trajectory_id, f.message) for f in dup] == [
        (3, "a", "id 'a' was first used on line 1"), (5, "b", "id 'b' was first used on line 2")]
    assert all(f.severity == "W" for f in dup)


@pytest.mark.parametrize("command", [
    ["convert", "{inp}", "--to", "ir", "-o", "{out}"],
    ["dedup", "{inp}", "-o", "{out}"],
    ["split", "{inp}", "--out", "{dir}"],
])
def test_commands_that_write_records_report_the_same_warnings(messy: Path, tmp_path: Path, command) -> None:
    args = [a.format(inp=messy, out=tmp_path / "o.jsonl", dir=tmp_path / "parts") for a in command]
    r = runner.invoke(app, ["data", *args])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("warnings in"))
    assert "W208 id-duplicate: 2" in line and "W222 arguments-double-encoded: 1" in line


@pytest.mark.parametrize("command", [
    ["convert", "{inp}", "--from", "openai", "--to", "ir", "-o", "{out}"],
    ["dedup", "{inp}", "-o", "{out}"],
    ["mix", "{inp}:1", "-o", "{out}"],
    ["stats", "{inp}"],
])
def test_an_empty_input_is_an_error_and_writes_nothing(tmp_path: Path, command) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    out = tmp_path / "o.jsonl"
    r = runner.invoke(app, ["data", *[a.format(inp=empty, out=out) for a in command]])
    errors = [x for x in r.output.splitlines() if x.startswith("error: ")]
    assert r.exit_code == DataError.exit_code, r.output
    assert len(errors) == 1 and "no records in file (E104 file-empty)" in errors[0]
    assert not out.exists()
