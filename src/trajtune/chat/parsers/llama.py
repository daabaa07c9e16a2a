"""Llama 3.x custom tools: ``{"name": …, "parameters": {…}}`` objects, optionally after ``<|python_tag|>``."""

from __future__ import annotations

import json
import re

from trajtune.chat.parsers.base import (
    _DECODER,
    ParseResult,
    _call_from_obj,
    _json_error,
    _skip_ws,
    _tidy,
    register_parser,
)
from trajtune.schema import ToolCall

_LLAMA_START = re.compile(r'\{\s*"name"\s*:')
_PYTHON_TAG = "<|python_tag|>"


@register_parser("llama3_json")
def parse_llama3_json(text: str) -> ParseResult:
    """Llama 3.x custom tools: ``{"name": …, "parameters": {…}}`` (``arguments`` accepted too),
    optionally after ``<|python_tag|>``; several calls may be separated by ``;`` or newlines.
    Text before the first call object is content."""
    errors: list[str] = []
    calls: list[ToolCall] = []
    body = text.replace(_PYTHON_TAG, "")
    m = _LLAMA_START.search(body)
    if m is None:
        return ParseResult(content=_tidy(body))
    content = body[:m.start()]
    pos = m.start()
    index = 0
    while pos < len(body):
        pos = _skip_ws(body, pos)
        if pos >= len(body):
            break
        if body[pos] != "{":
            errors.append(f"text after the tool calls: {body[pos:].strip()[:60]!r}")
            break
        try:
            obj, end = _DECODER.raw_decode(body, pos)
        except (json.JSONDecodeError, RecursionError) as e:
            errors.append(f"tool call {index}: invalid JSON ({_json_error(e)})")
            break
        call = _call_from_obj(obj, body[pos:end], errors, f"tool call {index}")
        if call is not None:
            calls.append(call)
        index += 1
        pos = _skip_ws(body, end)
        if pos < len(body) and body[pos] in ";,":
            pos += 1
    return ParseResult(content=_tidy(content), tool_calls=calls, errors=errors)
