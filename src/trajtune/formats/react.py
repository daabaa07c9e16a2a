"""ReAct text <-> IR: FireAct ``Thought/Action/Observation`` and AgentInstruct conversations.

Accepted records:

* AgentInstruct: ``{"id", "conversations": [{"from": "human"|"gpt"|"system", "value", "loss"}]}``;
  ``loss`` becomes the per-message ``train`` hint.
* FireAct text: ``{"id", "question", "trajectory": "Thought 1: ...\\nAction 1: Search[x]\\nObservation 1: ..."}``.
* ``{"messages": [{"role", "content"}]}`` whose assistant texts are ReAct steps (``--from react``).

``Action: name[free text]`` becomes a *custom* call (free-text ``input``); ``Action: name`` +
``Action Input: {json}`` becomes a function call with parsed arguments. Observations answer the
pending call; a final observation with no later assistant turn is kept.
"""

from __future__ import annotations

import json
import re
from typing import Any

from trajtune.formats._base import (
    ConversionError,
    ConversionReport,
    content_id,
    expect_object,
    link_tool_results,
    speaker_turn,
)
from trajtune.formats._common_export import declare_message_losses, declare_trajectory_losses
from trajtune.schema import Message, Provenance, ToolCall, Trajectory

NAME = "react"
_LABEL = re.compile(r"^[ \t]*(Thought|Action Input|Action|Observation|Act)(?:[ \t]+\d+)?[ \t]*:[ \t]?", re.I | re.M)
_BRACKET = re.compile(r"^\s*([\w.\-/ ]+?)\s*\[(.*)\]\s*$", re.S)
_ROLE = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def detect(record: Any) -> float:
    if not isinstance(record, dict):
        return 0.0
    if isinstance(record.get("trajectory"), str) and _LABEL.search(record["trajectory"]):
        return 0.95
    conv = record.get("conversations")
    if isinstance(conv, list) and conv and all(isinstance(t, dict) for t in conv):
        if any("loss" in t for t in conv):
            return 0.95
        if any(t.get("from") == "gpt" and isinstance(t.get("value"), str) and
               re.search(r"^\s*(Thought|Action)\s*\d*\s*:", t["value"], re.I | re.M) for t in conv):
            return 0.7
    return 0.0


def _split_labels(text: str) -> list[tuple[str, str]]:
    """``[(label, body)]`` for each ``Label:`` section; text before the first label has label ''."""
    out: list[tuple[str, str]] = []
    pos = 0
    label = ""
    for m in _LABEL.finditer(text):
        body = text[pos:m.start()]
        if out or body.strip() or label:
            out.append((label, body.strip("\n")))
        label = m.group(1).lower()
        pos = m.end()
    out.append((label, text[pos:].strip("\n")))
    return [(lbl, b) for lbl, b in out if lbl or b.strip()]


def parse_step(text: str, report: ConversionReport, where: str) -> tuple[str | None, ToolCall | None, str | None]:
    """One assistant ReAct turn -> (thought, call, content). Unparsable text stays as content."""
    sections = _split_labels(text)
    labels = [lbl for lbl, _ in sections]
    if "action" not in labels and "act" not in labels:
        return None, None, text
    thought_parts: list[str] = []
    call: ToolCall | None = None
    leftover: list[str] = []
    i = 0
    while i < len(sections):
        lbl, body = sections[i]
        if lbl in ("thought",):
            thought_parts.append(body.strip())
        elif lbl in ("action", "act") and call is None:
            nxt = sections[i + 1] if i + 1 < len(sections) else None
            if nxt is not None and nxt[0] == "action input":
                name = body.strip()
                raw = nxt[1].strip()
                try:
                    parsed = json.loads(raw)
                except json.JSONDecodeError:
                    parsed = None
                if isinstance(parsed, dict):
                    call = ToolCall(id="", name=name, arguments=parsed, arguments_raw=raw)
                else:
                    call = ToolCall(id="", type="custom", name=name, input=raw)
                i += 1
            else:
                m = _BRACKET.match(body)
                if m:
                    call = ToolCall(id="", type="custom", name=m.group(1).strip(), input=m.group(2))
                else:
                    first, _, rest = body.strip().partition("\n")
                    if not first:
                        report.warn(f"{where}: empty Action; text kept as content")
                        return None, None, text
                    call = ToolCall(id="", type="custom", name=first.strip(), input=rest.strip() or None)
        elif lbl == "":
            thought_parts.append(body.strip())
        else:
            leftover.append(body)
        i += 1
    if leftover:
        report.warn(f"{where}: text after the action was dropped: {leftover[0][:40]!r}")
        report.lose("text_after_action")
    thought = "\n".join(t for t in thought_parts if t) or None
    return thought, call, None


def _observation_text(value: str) -> str | None:
    m = re.match(r"^\s*Observation(?:\s+\d+)?\s*:\s?", value, re.I)
    return value[m.end():] if m else None


def to_ir(record: Any, *, line: int | None = None) -> tuple[Trajectory, ConversionReport]:
    report = ConversionReport(source_format=NAME, target_format="ir")
    expect_object(record)
    rid = record.get("id")
    tid = str(rid) if isinstance(rid, (str, int)) and not isinstance(rid, bool) and str(rid) else content_id("react", record)
    turns: list[tuple[str, str, bool | None]] = []  # (role, text, train)
    if isinstance(record.get("trajectory"), str):
        q = record.get("question") or record.get("instruction")
        if isinstance(record.get("system"), str):
            turns.append(("system", record["system"], None))
        if isinstance(q, str) and q:
            turns.append(("user", q, None))
        for lbl, body in _split_labels(record["trajectory"]):
            if lbl == "observation":
                turns.append(("user", "Observation: " + body.strip(), None))
            elif turns and turns[-1][0] == "assistant" and not turns[-1][1].lstrip().lower().startswith("observation"):
                r, t, tr = turns[-1]
                turns[-1] = (r, t + "\n" + (f"{lbl.title()}: " if lbl else "") + body.strip(), tr)
            elif lbl:
                turns.append(("assistant", f"{lbl.title()}: " + body.strip(), None))
            else:
                turns.append(("user", body.strip(), None))
    elif isinstance(record.get("conversations"), list) or isinstance(record.get("messages"), list):
        key = "conversations" if isinstance(record.get("conversations"), list) else "messages"
        for i, t in enumerate(record[key]):
            where = f"{key}[{i}]"
            role, value = speaker_turn(t, where, _ROLE, hint="use human, gpt or system")
            loss = t.get("loss")
            if loss is not None and not isinstance(loss, bool):
                raise ConversionError(f"{where}: loss must be true, false or null", rule="E111")
            turns.append((role, value, loss))
    else:
        raise ConversionError("expected 'conversations', 'messages' or a 'trajectory' string",
                              hint='AgentInstruct: {"conversations": [{"from": "human", "value": ..., "loss": false}]}')

    messages: list[Message] = []
    pending: list[ToolCall] = []
    pairs: list[tuple[Message, ToolCall]] = []
    for i, (role, text, train) in enumerate(turns):
        if role == "assistant":
            thought, call, content = parse_step(text, report, f"turn {i}")
            msg = Message(role="assistant", content=content, thought=thought, train=train,
                          tool_calls=[call] if call is not None else None)
            if call is not None:
                pending = [call]
            messages.append(msg)
            continue
        obs = _observation_text(text) if role == "user" else None
        if obs is not None and pending:
            msg = Message(role="tool", origin="environment", content=obs, train=train)
            pairs.append((msg, pending.pop(0)))
        elif obs is not None:
            msg = Message(role="user", origin="environment", content=text, train=train)
        else:
            msg = Message(role=role, content=text, train=train)
        messages.append(msg)
    traj = Trajectory(id=tid, messages=messages,
                      provenance=Provenance(source_format=NAME, record_id=str(rid) if rid is not None else None,
                                            converter="trajtune.formats.react"))
    link_tool_results(traj, pairs)
    return traj, report


def format_action(c: ToolCall) -> str:
    """A call as ReAct text: ``name[input]`` for free text, ``Action Input:`` JSON for arguments."""
    if c.type == "custom" or c.code is not None:
        arg = c.input if c.input is not None else (c.code.source if c.code is not None else "")
        return f"Action: {c.name}[{arg}]"
    raw = c.arguments_raw
    if raw is None or (c.arguments is not None and _loads_or_none(raw) != c.arguments):  # e.g. double-encoded
        raw = json.dumps(c.arguments or {}, ensure_ascii=False)
    return f"Action: {c.name}\nAction Input: {raw}"


def _loads_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None


def from_ir(traj: Trajectory) -> tuple[dict[str, Any], ConversionReport]:
    report = ConversionReport(source_format="ir", target_format=NAME)
    declare_trajectory_losses(traj, NAME, report)
    if traj.tools:
        report.lose("tools")
    conv: list[dict[str, Any]] = []
    msgs = traj.messages
    i = 0
    while i < len(msgs):
        m = msgs[i]
        declare_message_losses(m, NAME, report, keeps_thought=True, keeps_train=True, keeps_custom=True)
        if isinstance(m.content, list) and any(p.type != "text" for p in m.content):
            report.lose("non_text_content")
        turn: dict[str, Any]
        if m.role == "assistant":
            lines = []
            if m.thought:
                lines.append(f"Thought: {m.thought}")
            if m.text():
                lines.append(m.text())
            calls = m.tool_calls or []
            if len(calls) > 1:
                report.lose("parallel_calls")
            for c in calls:
                if c.code is not None:
                    report.lose("code_language")
                lines.append(format_action(c))
            turn = {"from": "gpt", "value": "\n".join(lines)}
        elif m.role == "tool":
            group = [m]
            while i + 1 < len(msgs) and msgs[i + 1].role == "tool":
                i += 1
                declare_message_losses(msgs[i], NAME, report, keeps_thought=True, keeps_train=True, keeps_custom=True)
                group.append(msgs[i])
            turn = {"from": "human", "value": "\n".join(f"Observation: {g.text()}" for g in group)}
        elif m.role in ("system", "developer"):
            turn = {"from": "system", "value": m.text()}
        else:
            turn = {"from": "human", "value": m.text()}
        turn["loss"] = m.train
        conv.append(turn)
        i += 1
    return {"id": traj.id, "conversations": conv}, report
