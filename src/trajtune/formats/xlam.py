"""xLAM / ActionStudio unified trajectories <-> IR.

``{unique_trajectory_id, task_instruction, tools, conversation}`` where ``conversation`` holds
OpenAI-like messages whose call ``arguments`` are dicts, not strings. Real data has results whose
``tool_call_id`` does not match any call; those are re-paired by position and the repair is
reported (the original id is kept under ``extra["xlam"]``).
"""

from __future__ import annotations

from typing import Any

from trajtune.formats._base import (
    ConversionError,
    ConversionReport,
    arguments_dict,
    content_id,
    expect_object,
    parse_arguments,
)
from trajtune.formats._common_export import declare_message_losses, declare_trajectory_losses
from trajtune.formats.sharegpt import parse_tools
from trajtune.schema import Message, Provenance, ToolCall, Trajectory, generate_call_ids

NAME = "xlam"


def detect(record: Any) -> float:
    if isinstance(record, dict) and isinstance(record.get("conversation"), list) and \
            ("task_instruction" in record or "unique_trajectory_id" in record):
        return 0.95
    return 0.0


def _call(c: Any, where: str) -> ToolCall:
    if not isinstance(c, dict):
        raise ConversionError(f"{where}: a tool call must be an object", rule="E111")
    fn = c.get("function") if isinstance(c.get("function"), dict) else c
    if not isinstance(fn.get("name"), str):
        raise ConversionError(f"{where}: tool call needs a 'name'", rule="E111")
    args, raw = parse_arguments(fn.get("arguments", {}))
    cid = c.get("id")
    return ToolCall(id=cid if isinstance(cid, str) else "", name=fn["name"], arguments=args, arguments_raw=raw)


def to_ir(record: Any, *, line: int | None = None) -> tuple[Trajectory, ConversionReport]:
    report = ConversionReport(source_format=NAME, target_format="ir")
    expect_object(record)
    conv = record.get("conversation")
    if not isinstance(conv, list):
        raise ConversionError("missing 'conversation' list", hint="xLAM records are {unique_trajectory_id, task_instruction, tools, conversation}")
    rid = record.get("unique_trajectory_id")
    tid = str(rid) if isinstance(rid, (str, int)) and not isinstance(rid, bool) and str(rid) else content_id("xlam", record)
    messages: list[Message] = []
    ti = record.get("task_instruction")
    if isinstance(ti, str) and ti:
        messages.append(Message(role="system", content=ti, extra={"xlam": {"task_instruction": True}}))
    pending: list[ToolCall] = []
    for i, m in enumerate(conv):
        where = f"conversation[{i}]"
        if not isinstance(m, dict):
            raise ConversionError(f"{where}: expected an object", rule="E111")
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise ConversionError(f"{where}: invalid role {role!r}", rule="E203")
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise ConversionError(f"{where}: content must be a string", rule="E204")
        msg = Message(role=role, content=content, name=m.get("name") if isinstance(m.get("name"), str) else None)
        if role == "assistant" and m.get("tool_calls"):
            if not isinstance(m["tool_calls"], list):
                raise ConversionError(f"{where}: tool_calls must be a list", rule="E111")
            msg.tool_calls = [_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(m["tool_calls"])]
            pending = list(msg.tool_calls)
        if role == "tool":
            msg.origin = "environment"
            tcid = m.get("tool_call_id")
            match = next((c for c in pending if c.id and c.id == tcid), None)
            if match is None and pending:
                match = pending[0]
                if tcid is not None:
                    msg.extra["xlam"] = {"original_tool_call_id": tcid}
                    report.warn(f"{where}: tool_call_id {tcid!r} matches no pending call; paired by position")
            if match is not None:
                pending.remove(match)
                msg.extra.setdefault("xlam", {})["_call"] = match
            elif isinstance(tcid, str):
                msg.tool_call_id = tcid
        messages.append(msg)
    traj = Trajectory(id=tid, messages=messages, tools=parse_tools(record.get("tools")),
                      provenance=Provenance(source_format=NAME, record_id=str(rid) if rid is not None else None,
                                            converter="trajtune.formats.xlam"))
    extra = {k: v for k, v in record.items() if k not in {"unique_trajectory_id", "task_instruction", "tools", "conversation"}}
    if extra:
        traj.extra["xlam"] = {"top": extra}
    generate_call_ids(traj)
    for msg in messages:
        call = msg.extra.get("xlam", {}).pop("_call", None)
        if call is not None:
            msg.tool_call_id = call.id
        if msg.extra.get("xlam") == {}:
            msg.extra.pop("xlam")
    return traj, report


def from_ir(traj: Trajectory) -> tuple[dict[str, Any], ConversionReport]:
    report = ConversionReport(source_format="ir", target_format=NAME)
    declare_trajectory_losses(traj, NAME, report)
    rec: dict[str, Any] = {"unique_trajectory_id": traj.id, "task_instruction": ""}
    conv: list[dict[str, Any]] = []
    msgs = list(traj.messages)
    if msgs and msgs[0].role in ("system", "developer"):
        rec["task_instruction"] = msgs[0].text()
        declare_message_losses(msgs[0], NAME, report, keeps_ids=True)
        msgs = msgs[1:]
    for m in msgs:
        declare_message_losses(m, NAME, report, keeps_ids=True)
        if isinstance(m.content, list) and any(p.type != "text" for p in m.content):
            report.lose("non_text_content")
        out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text() if m.content is not None else None}
        if m.name is not None:
            out["name"] = m.name
        if m.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": arguments_dict(c.arguments, c.arguments_raw, report)
                                               if c.type != "custom" else {"input": c.input}}} for c in m.tool_calls]
        if m.tool_call_id is not None:
            out["tool_call_id"] = m.tool_call_id
        conv.append(out)
    rec["tools"] = [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in traj.tools]
    rec["conversation"] = conv
    top = traj.extra.get("xlam", {}).get("top", {}) if isinstance(traj.extra.get("xlam"), dict) else {}
    rec.update(top)
    return rec, report
