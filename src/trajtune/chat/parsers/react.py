"""ReAct text: ``Thought: …`` then ``Action: name[args]`` or ``Action:`` + ``Action Input:``."""

from __future__ import annotations

import json
import re
from typing import Any

from trajtune.chat.parsers.base import ParseResult, _json_error, _tidy, register_parser
from trajtune.schema import ToolCall

_ACTION = re.compile(r"^[ \t]*Action[ \t]*:[ \t]*(.*)$", re.MULTILINE)
_ACTION_INPUT = re.compile(r"^[ \t]*Action[ \t]+Input[ \t]*:[ \t]*", re.MULTILINE)
_OBSERVATION = re.compile(r"^[ \t]*Observation[ \t]*:", re.MULTILINE)
_FINAL = re.compile(r"^[ \t]*Final[ \t]+Answer[ \t]*:[ \t]*", re.MULTILINE)


def _react_args(raw: str, where: str, errors: list[str]) -> dict[str, Any] | None:
    """A JSON object stays a dict; any other text is the single ``input`` argument (the classic
    ReAct convention); empty input is an empty call."""
    raw = raw.strip()
    if not raw:
        return {}
    if raw.startswith("{"):
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, RecursionError) as e:
            errors.append(f"{where}: action input looks like JSON but is invalid ({_json_error(e)})")
            return None
        if isinstance(obj, dict):
            return obj
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        raw = raw[1:-1]
    return {"input": raw}


@register_parser("react")
def parse_react(text: str) -> ParseResult:
    """ReAct text: ``Thought: …`` then ``Action: name[args]`` or ``Action: name`` + ``Action Input:
    args``. ``Final Answer: x`` is content. Text the model invents after its action (a fake
    ``Observation:``) is cut off and reported."""
    errors: list[str] = []
    calls: list[ToolCall] = []
    body = text
    obs = _OBSERVATION.search(body)
    first_action = _ACTION.search(body)
    if obs is not None and first_action is not None and obs.start() > first_action.start():
        errors.append("text after the action (the model wrote its own Observation)")
        body = body[:obs.start()]
    actions = list(_ACTION.finditer(body))
    if not actions:
        fin = _FINAL.search(body)
        content = body[fin.end():] if fin else body
        return ParseResult(content=_tidy(content), errors=errors)
    content = body[:actions[0].start()]
    for i, m in enumerate(actions):
        where = f"tool call {i}"
        seg_end = actions[i + 1].start() if i + 1 < len(actions) else len(body)
        head = m.group(1).strip()
        segment = body[m.end():seg_end]
        bracket = head.find("[")
        if bracket > 0:
            name = head[:bracket].strip()
            close = head.rfind("]")
            if close < bracket:
                errors.append(f"{where}: unterminated {name}[…]")
                continue
            raw = head[bracket + 1:close]
            if head[close + 1:].strip():
                errors.append(f"{where}: text after {name}[…] on the action line")
        else:
            name = head
            ai = _ACTION_INPUT.search(segment)
            raw = segment[ai.end():] if ai else ""
        if not re.fullmatch(r"[A-Za-z_][\w.\-]*", name or ""):
            errors.append(f"{where}: invalid tool name {name!r}")
            continue
        args = _react_args(raw, where, errors)
        if args is None:  # reported; a call with unreadable arguments is not executed
            continue
        calls.append(ToolCall(id="", name=name, arguments=args, arguments_raw=raw.strip() or None))
    return ParseResult(content=_tidy(content), tool_calls=calls, errors=errors)
