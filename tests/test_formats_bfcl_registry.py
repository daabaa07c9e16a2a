"""BFCL is reachable through the format registry (auto-detection, load_any, declared losses)."""

from __future__ import annotations

import json

from trajtune.plugins.bfcl.data import load_bfcl
from trajtune.formats import detect_format, get_format, load_any
from trajtune.schema import Message


def test_bfcl_through_the_registry(tmp_path):
    fmt = get_format("bfcl")
    trajs = load_bfcl("simple_python", limit=3)
    records = [fmt.from_ir(t)[0] for t in trajs]
    assert detect_format(records[0]) == "bfcl"
    p = tmp_path / "bfcl.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in records))
    back = list(load_any(p))  # auto-detected
    assert [t.id for t in back] == [t.id for t in trajs]
    assert [t.tools[0].name for t in back] == [t.tools[0].name for t in trajs]
    # exporting a trajectory with agent turns declares what BFCL cannot hold
    t = trajs[0].model_copy(deep=True)
    t.messages.append(Message(role="assistant", content="x"))
    assert "assistant_and_tool_turns" in fmt.from_ir(t)[1].losses
