"""Hermes / Qwen 2.5: ``<tool_call>{json}</tool_call>`` blocks in the assistant text."""

from __future__ import annotations

import json
import re
from typing import Any

from trajtune.chat.parsers.base import ParseResult, _call_from_obj, _json_error, register_parser
from trajtune.formats._base import python_literal_to_json
from trajtune.schema import ToolCall

_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"


def _hermes_object(raw: str, errors: list[str], where: str) -> Any:
    """JSON inside a ``<tool_call>`` block; failing that, a Python literal (``{'name': 'f', ...}``,
    which some models write), read by ``ast`` rules and reported as a format error. None if neither."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as e:
        why = _json_error(e)
    try:
        obj = python_literal_to_json(raw)
    except ValueError:
        errors.append(f"{where}: invalid JSON ({why})")
        return None
    errors.append(f"{where}: not strict JSON but a Python literal (e.g. single quotes); parsed with ast.literal_eval rules")
    return obj


@register_parser("hermes")
def parse_hermes(text: str) -> ParseResult:
    """Hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks."""
    errors: list[str] = []
    calls: list[ToolCall] = []
    content_parts: list[str] = []
    pos = 0
    index = 0
    while True:
        start = text.find(_HERMES_OPEN, pos)
        if start < 0:
            content_parts.append(text[pos:])
            break
        content_parts.append(text[pos:start])
        body_start = start + len(_HERMES_OPEN)
        end = text.find(_HERMES_CLOSE, body_start)
        where = f"tool call {index}"
        if end < 0:
            body = text[body_start:]
            errors.append(f"{where}: unterminated {_HERMES_OPEN}")
            pos = len(text)
        else:
            body = text[body_start:end]
            pos = end + len(_HERMES_CLOSE)
        raw = body.strip()
        if not raw:
            errors.append(f"{where}: empty tool call")
        else:
            obj = _hermes_object(raw, errors, where)
            call = _call_from_obj(obj, raw, errors, where) if obj is not None else None
            if call is not None:
                calls.append(call)
        index += 1
        if end < 0:
            break
    content = "".join(content_parts)
    if _HERMES_CLOSE in content:
        errors.append(f"stray {_HERMES_CLOSE} without an opening tag")
    content = re.sub(r"\n{3,}", "\n\n", content).strip()
    return ParseResult(content=content, tool_calls=calls, errors=errors)
