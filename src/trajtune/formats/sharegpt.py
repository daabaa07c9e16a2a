"""ShareGPT as used by LLaMA-Factory <-> IR.

``conversations[{from, value}]`` with ``human``/``gpt``/``function_call``/``observation`` turns, an
optional ``system`` string and ``tools`` as a JSON *string*. The format has no call ids (they are
generated on import, lost on export), puts parallel calls as a JSON list in one ``function_call``
and all their results in one ``observation``, and requires strict alternation.
"""

from __future__ import annotations

import json
from typing import Any

from trajtune.formats._base import (
    ConversionError,
    ConversionReport,
    arguments_dict,
    content_id,
    expect_object,
    link_tool_results,
    parse_arguments,
)
from trajtune.formats._common_export import declare_message_losses, declare_trajectory_losses
from trajtune.schema import Message, Provenance, ToolCall, ToolSpec, Trajectory

NAME = "sharegpt"
_ROLE = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def detect(record: Any) -> float:
    if not isinstance(record, dict) or not isinstance(record.get("conversations"), list):
        return 0.0
    turns = [t for t in record["conversations"] if isinstance(t, dict)]
    if not turns or not all("from" in t and "value" in t for t in turns):
        return 0.1
    froms = {t.get("from") for t in turns}
    if froms & {"function_call", "observation"}:
        return 0.9
    return 0.6


def parse_tools(tools: Any) -> list[ToolSpec]:
    """``tools`` as LLaMA-Factory stores it (a JSON string) or already a list; both spec shapes."""
    if tools is None or tools == "":
        return []
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            raise ConversionError(f"'tools' is not valid JSON: {e.msg}", rule="E111",
                                  hint="tools must be a JSON string holding a list of function specs") from None
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list):
        raise ConversionError("'tools' must be a list of function specs", rule="E111")
    out = []
    for spec in tools:
        if not isinstance(spec, dict):
            raise ConversionError("each tool spec must be an object", rule="E111")
        fn = spec.get("function") if isinstance(spec.get("function"), dict) else spec
        if not isinstance(fn.get("name"), str):
            raise ConversionError("a tool spec lacks a 'name'", rule="E111")
        params = fn.get("parameters")
        out.append(ToolSpec(name=fn["name"], description=fn.get("description") or "",
                            parameters=params if isinstance(params, dict) else {"type": "object", "properties": {}}, raw=spec))
    return out


def _parse_calls(value: Any, where: str) -> list[ToolCall]:
    if isinstance(value, str):
        try:
            obj = json.loads(value)
        except json.JSONDecodeError as e:
            raise ConversionError(f"{where}: function_call value is not valid JSON ({e.msg})", rule="E110",
                                  hint='function_call turns hold {"name": ..., "arguments": {...}} or a list of them') from None
    else:
        obj = value
    objs = obj if isinstance(obj, list) else [obj]
    calls = []
    for o in objs:
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise ConversionError(f"{where}: each call needs a 'name'", rule="E110",
                                  hint='function_call turns hold {"name": ..., "arguments": {...}}')
        args, raw = parse_arguments(o.get("arguments", {}))
        calls.append(ToolCall(id="", name=o["name"], arguments=args, arguments_raw=raw))
    return calls


def to_ir(record: Any, *, line: int | None = None) -> tuple[Trajectory, ConversionReport]:
    report = ConversionReport(source_format=NAME, target_format="ir")
    expect_object(record)
    conv = record.get("conversations")
    if not isinstance(conv, list):
        raise ConversionError("missing 'conversations' list", hint='ShareGPT records are {"conversations": [{"from": "human", "value": ...}]}')
    tid = record.get("id") if isinstance(record.get("id"), str) and record.get("id") else content_id("sharegpt", record)
    messages: list[Message] = []
    system = record.get("system")
    if isinstance(system, str) and system:
        messages.append(Message(role="system", content=system))
    pending: list[ToolCall] = []
    pairs: list[tuple[Message, ToolCall]] = []  # tool results, resolved to ids once ids exist
    for i, t in enumerate(conv):
        where = f"conversations[{i}]"
        if not isinstance(t, dict) or "from" not in t:
            raise ConversionError(f"{where}: each turn needs 'from' and 'value'", rule="E111")
        frm, value = t.get("from"), t.get("value")
        if frm == "function_call":
            calls = _parse_calls(value, where)
            messages.append(Message(role="assistant", tool_calls=calls))
            pending = list(calls)
            continue
        if not isinstance(value, str):
            raise ConversionError(f"{where}: value must be a string, got {type(value).__name__}", rule="E204")
        if frm in ("observation", "tool"):
            results: list[str] = [value]
            if len(pending) > 1:
                try:
                    parsed = json.loads(value)
                except json.JSONDecodeError:
                    parsed = None
                if isinstance(parsed, list) and len(parsed) == len(pending):
                    results = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in parsed]
                else:
                    report.warn(f"{where}: one observation for {len(pending)} parallel calls; attached to the first")
            if not pending:
                messages.append(Message(role="user", origin="environment", content=value))
                report.warn(f"{where}: observation without a preceding function_call kept as a user turn")
                continue
            for r in results:
                msg = Message(role="tool", origin="environment", content=r)
                pairs.append((msg, pending.pop(0)))
                messages.append(msg)
            pending = []
            continue
        role = _ROLE.get(frm) if isinstance(frm, str) else None
        if role is None:
            raise ConversionError(f"{where}: unknown 'from' value {frm!r}", rule="E203",
                                  hint="use human, gpt, function_call, observation or system")
        messages.append(Message(role=role, content=value))
    tools = parse_tools(record.get("tools"))
    known = {"id", "conversations", "system", "tools"}
    extra = {k: v for k, v in record.items() if k not in known}
    traj = Trajectory(id=tid, messages=messages, tools=tools,
                      provenance=Provenance(source_format=NAME, record_id=record.get("id") if isinstance(record.get("id"), str) else None,
                                            converter="trajtune.formats.sharegpt"),
                      extra={"sharegpt": {"top": extra}} if extra else {})
    link_tool_results(traj, pairs)
    return traj, report


def _text(m: Message, report: ConversionReport) -> str:
    if isinstance(m.content, list) and any(p.type != "text" for p in m.content):
        report.lose("non_text_content")
    return m.text()


def from_ir(traj: Trajectory) -> tuple[dict[str, Any], ConversionReport]:
    report = ConversionReport(source_format="ir", target_format=NAME)
    declare_trajectory_losses(traj, NAME, report)
    rec: dict[str, Any] = {"id": traj.id}
    turns: list[dict[str, Any]] = []
    msgs = list(traj.messages)
    if msgs and msgs[0].role in ("system", "developer"):
        rec["system"] = _text(msgs[0], report)
        declare_message_losses(msgs[0], NAME, report)
        msgs = msgs[1:]
    i = 0
    while i < len(msgs):
        m = msgs[i]
        declare_message_losses(m, NAME, report)
        if m.role in ("system", "developer"):
            report.lose("system_position")
            turns.append({"from": "human", "value": _text(m, report)})
        elif m.role == "user":
            turns.append({"from": "human", "value": _text(m, report)})
        elif m.role == "assistant" and m.tool_calls:
            if m.text().strip():
                report.lose("content_with_tool_calls")
            objs = [{"name": c.name, "arguments": arguments_dict(c.arguments, c.arguments_raw, report)
                     if c.type != "custom" else {"input": c.input}} for c in m.tool_calls]
            turns.append({"from": "function_call", "_items": objs})
        elif m.role == "assistant":
            turns.append({"from": "gpt", "value": _text(m, report)})
        else:  # tool results: the whole contiguous group becomes one observation
            group = [m]
            while i + 1 < len(msgs) and msgs[i + 1].role == "tool":
                i += 1
                declare_message_losses(msgs[i], NAME, report)
                group.append(msgs[i])
            turns.append({"from": "observation", "_items": [_text(g, report) for g in group]})
        i += 1
    rec["conversations"] = _enforce_alternation(turns, report)
    if traj.tools:
        rec["tools"] = json.dumps([{"name": t.name, "description": t.description, "parameters": t.parameters} for t in traj.tools],
                                  ensure_ascii=False)
    top = traj.extra.get("sharegpt", {}).get("top", {}) if isinstance(traj.extra.get("sharegpt"), dict) else {}
    rec.update(top)
    return rec, report


_SIDE = {"human": 0, "observation": 0, "gpt": 1, "function_call": 1}


def _serialise(t: dict[str, Any]) -> dict[str, str]:
    if "_items" not in t:
        return t
    items = t["_items"]
    if t["from"] == "function_call":  # one call: an object; parallel calls: a list
        return {"from": "function_call", "value": json.dumps(items[0] if len(items) == 1 else items, ensure_ascii=False)}
    # one result: the text itself; results of parallel calls: a JSON list of texts
    return {"from": "observation", "value": items[0] if len(items) == 1 else json.dumps(items, ensure_ascii=False)}


def _enforce_alternation(turns: list[dict[str, Any]], report: ConversionReport) -> list[dict[str, str]]:
    """LLaMA-Factory rejects non-alternating conversations: merge same-side runs, drop a trailing prompt.

    Consecutive call turns become one parallel call list and consecutive results one observation
    (declared as ``message_grouping``); other same-side runs are joined as text (``merged_turns``).
    """
    out: list[dict[str, Any]] = []
    for t in turns:
        if out and _SIDE[out[-1]["from"]] == _SIDE[t["from"]]:
            prev = out[-1]
            if prev["from"] == t["from"] and "_items" in t:
                prev["_items"] = prev["_items"] + t["_items"]
                report.lose("message_grouping")
            elif prev["from"] == "gpt" and t["from"] == "function_call":
                out[-1] = t
                report.lose("content_with_tool_calls")
            elif prev["from"] == "function_call" and t["from"] == "gpt":  # calls then text: the text is lost
                report.lose("content_with_tool_calls")
            else:
                a, b = _serialise(prev)["value"], _serialise(t)["value"]
                out[-1] = {"from": prev["from"], "value": a + "\n\n" + b}
                report.lose("merged_turns")
            continue
        out.append(dict(t))
    if out and _SIDE[out[0]["from"]] == 1:
        out.insert(0, {"from": "human", "value": ""})
        report.warn("conversation started with an assistant turn; an empty human turn was inserted")
    if out and _SIDE[out[-1]["from"]] == 0:
        out.pop()
        report.lose("trailing_turn")
    return [_serialise(t) for t in out]
