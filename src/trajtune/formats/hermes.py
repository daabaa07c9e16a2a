"""Hermes / Qwen tool-calling text <-> IR.

Calls live inside assistant text as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
blocks, results inside ``<tool_response>...</tool_response>``, tool specs inside ``<tools>...</tools>``
in the system prompt. Real data has unterminated tags, invalid JSON and text after the last
block: the parser reports those in ``ConversionReport.warnings`` and keeps the text verbatim
instead of crashing or guessing.

Accepted records: ``{"conversations": [{"from": "system"|"human"|"gpt"|"tool", "value"}]}``
(hermes-function-calling-v1) or ``{"messages": [{"role", "content"}]}`` (Qwen style).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from trajtune.formats._base import (
    ConversionError,
    ConversionReport,
    content_id,
    expect_object,
    link_tool_results,
    parse_arguments,
    python_literal_to_json,
    speaker_turn,
)
from trajtune.formats._common_export import declare_message_losses, declare_trajectory_losses
from trajtune.schema import Message, Provenance, ToolCall, ToolSpec, Trajectory

NAME = "hermes"
_ROLE = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "tool": "tool"}
_TOOLS_RE = re.compile(r"<tools>(.*?)</tools>", re.S)
_CALL_OPEN, _CALL_CLOSE = "<tool_call>", "</tool_call>"
_RESP_RE = re.compile(r"<tool_response>(.*?)</tool_response>", re.S)
DEFAULT_SYSTEM = ("You are a function calling AI model. You are provided with function signatures within <tools></tools> "
                  "XML tags. You may call one or more functions to assist with the user query. For each function call "
                  "return a json object with function name and arguments within <tool_call></tool_call> XML tags.")


def _turns(record: dict[str, Any]) -> list[Any] | None:
    for key in ("conversations", "messages"):
        if isinstance(record.get(key), list):
            return record[key]
    return None


def detect(record: Any) -> float:
    if not isinstance(record, dict):
        return 0.0
    turns = _turns(record)
    if not turns:
        return 0.0
    for t in turns:
        if not isinstance(t, dict):
            continue
        v = t.get("value", t.get("content"))
        if isinstance(v, str) and ("<tool_call>" in v or "<tools>" in v or "<tool_response>" in v):
            if not any(isinstance(x, dict) and x.get("tool_calls") for x in turns):
                return 0.95
    return 0.0


def parse_tools_block(text: str, report: ConversionReport) -> list[ToolSpec]:
    """Tool specs inside ``<tools>``: a JSON list, one JSON object per line, or a Python literal."""
    m = _TOOLS_RE.search(text)
    if not m:
        return []
    body = m.group(1).strip()
    specs: Any = None
    for loader in (json.loads, ast.literal_eval):
        try:
            specs = loader(body)
            break
        except (ValueError, SyntaxError, RecursionError, MemoryError):
            continue
    if specs is None:
        specs = []
        for ln in body.splitlines():
            ln = ln.strip()
            if ln:
                try:
                    specs.append(json.loads(ln))
                except json.JSONDecodeError:
                    report.warn("a line inside <tools> is not JSON; skipped")
    if isinstance(specs, dict):
        specs = [specs]
    out = []
    for s in specs if isinstance(specs, list) else []:
        fn = s.get("function") if isinstance(s, dict) and isinstance(s.get("function"), dict) else s
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out.append(ToolSpec(name=fn["name"], description=fn.get("description") or "",
                                parameters=params if isinstance(params, dict) else {"type": "object", "properties": {}}, raw=s))
    return out


def _call_object(raw: str, report: ConversionReport, where: str) -> Any:
    """The object inside one ``<tool_call>`` block: JSON, or else a Python literal (single quotes,
    ``True``/``None``), which is reported as not strict JSON. None (reported) when it is neither."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as e:
        why = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deep"
    try:
        obj = python_literal_to_json(raw)
    except ValueError:
        report.warn(f"{where}: <tool_call> holds invalid JSON ({why}); the turn is kept as plain text")
        return None
    report.warn(f"{where}: <tool_call> is not strict JSON but a Python literal (e.g. single quotes); "
                "read with ast.literal_eval rules")
    return obj


def parse_assistant_text(text: str, report: ConversionReport, where: str = "") -> tuple[str | None, str | None, list[ToolCall] | None]:
    """``(reasoning, content, calls)`` from one assistant turn; bad blocks keep the text as content."""
    reasoning = None
    body = text
    stripped = body.lstrip()
    if stripped.startswith("<think>"):
        end = stripped.find("</think>")
        if end == -1:
            report.warn(f"{where}: unterminated <think>; kept in content")
        else:
            reasoning = stripped[len("<think>"):end].strip("\n")
            body = stripped[end + len("</think>"):].lstrip("\n")
    if _CALL_OPEN not in body:
        return reasoning, body, None
    calls: list[ToolCall] = []
    pieces: list[str] = []
    pos = 0
    while True:
        start = body.find(_CALL_OPEN, pos)
        if start == -1:
            break
        pieces.append(body[pos:start])
        end = body.find(_CALL_CLOSE, start)
        if end == -1:
            report.warn(f"{where}: unterminated <tool_call>; the turn is kept as plain text")
            return reasoning, body, None
        raw = body[start + len(_CALL_OPEN):end].strip()
        obj = _call_object(raw, report, where)
        if obj is None:
            return reasoning, body, None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            report.warn(f"{where}: <tool_call> lacks a 'name'; the turn is kept as plain text")
            return reasoning, body, None
        args, araw = parse_arguments(obj.get("arguments", obj.get("parameters", {})))
        calls.append(ToolCall(id="", name=obj["name"], arguments=args, arguments_raw=araw))
        pos = end + len(_CALL_CLOSE)
    tail = body[pos:]
    if tail.strip():
        report.warn(f"{where}: text after the last </tool_call> moved into the content")
    content = ("".join(pieces).strip() + ("\n" + tail.strip() if tail.strip() else "")).strip()
    return reasoning, content or None, calls


def to_ir(record: Any, *, line: int | None = None) -> tuple[Trajectory, ConversionReport]:
    report = ConversionReport(source_format=NAME, target_format="ir")
    expect_object(record)
    turns = _turns(record)
    if turns is None:
        raise ConversionError("missing 'conversations' or 'messages' list", hint='{"conversations": [{"from": "human", "value": ...}]}')
    rid = record.get("id")
    tid = str(rid) if isinstance(rid, (str, int)) and not isinstance(rid, bool) and str(rid) else content_id("hermes", record)
    messages: list[Message] = []
    tools: list[ToolSpec] = []
    pending: list[ToolCall] = []
    pairs: list[tuple[Message, ToolCall]] = []
    for i, t in enumerate(turns):
        where = f"turn {i}"
        role, value = speaker_turn(t, where, _ROLE)
        if role == "system":
            tools.extend(parse_tools_block(value, report))
            messages.append(Message(role="system", content=value))
        elif role == "assistant":
            reasoning, content, calls = parse_assistant_text(value, report, where)
            messages.append(Message(role="assistant", content=content, reasoning_content=reasoning, tool_calls=calls))
            pending = list(calls or [])
        else:
            blocks = _RESP_RE.findall(value)
            if role == "user" and not blocks:
                messages.append(Message(role="user", content=value))
                continue
            if not blocks:
                blocks = [value]
            elif "<tool_response>" in _RESP_RE.sub("", value):
                report.warn(f"{where}: unterminated <tool_response>")
            for b in blocks:
                msg = Message(role="tool", origin="environment", content=b.strip("\n"))
                if pending:
                    pairs.append((msg, pending.pop(0)))
                else:
                    report.warn(f"{where}: tool response without a pending call")
                messages.append(msg)
    traj = Trajectory(id=tid, messages=messages, tools=tools,
                      provenance=Provenance(source_format=NAME, record_id=str(rid) if rid is not None else None,
                                            converter="trajtune.formats.hermes"))
    link_tool_results(traj, pairs)
    return traj, report


def _tools_block(tools: list[ToolSpec]) -> str:
    return "<tools>\n" + "\n".join(json.dumps(t.to_openai(), ensure_ascii=False) for t in tools) + "\n</tools>"


def from_ir(traj: Trajectory) -> tuple[dict[str, Any], ConversionReport]:
    report = ConversionReport(source_format="ir", target_format=NAME)
    declare_trajectory_losses(traj, NAME, report)
    conv: list[dict[str, str]] = []
    msgs = list(traj.messages)
    has_tools_prompt = any(m.role == "system" and "<tools>" in m.text() for m in msgs)
    if traj.tools and not has_tools_prompt:
        if msgs and msgs[0].role in ("system", "developer"):
            first = msgs.pop(0)
            declare_message_losses(first, NAME, report, keeps_reasoning=True)
            conv.append({"from": "system", "value": first.text() + "\n\n" + _tools_block(traj.tools)})
        else:
            conv.append({"from": "system", "value": DEFAULT_SYSTEM + "\n" + _tools_block(traj.tools)})
    i = 0
    while i < len(msgs):
        m = msgs[i]
        declare_message_losses(m, NAME, report, keeps_reasoning=True)
        if isinstance(m.content, list) and any(p.type != "text" for p in m.content):
            report.lose("non_text_content")
        if m.role in ("system", "developer"):
            conv.append({"from": "system", "value": m.text()})
        elif m.role == "user":
            conv.append({"from": "human", "value": m.text()})
        elif m.role == "assistant":
            parts = []
            if m.reasoning_content is not None:
                parts.append(f"<think>\n{m.reasoning_content}\n</think>")
            if m.text():
                parts.append(m.text())
            for c in m.tool_calls or []:
                args: Any = c.arguments if c.arguments is not None else ({"input": c.input} if c.type == "custom" else {})
                if c.arguments is None and c.arguments_raw is not None:
                    report.lose("invalid_arguments")
                parts.append(_CALL_OPEN + "\n" + json.dumps({"name": c.name, "arguments": args}, ensure_ascii=False) + "\n" + _CALL_CLOSE)
            conv.append({"from": "gpt", "value": "\n".join(parts)})
        else:
            group = [m]
            while i + 1 < len(msgs) and msgs[i + 1].role == "tool":
                i += 1
                declare_message_losses(msgs[i], NAME, report, keeps_reasoning=True)
                group.append(msgs[i])
            conv.append({"from": "tool", "value": "\n".join(f"<tool_response>\n{g.text()}\n</tool_response>" for g in group)})
        i += 1
    return {"id": traj.id, "conversations": conv}, report
