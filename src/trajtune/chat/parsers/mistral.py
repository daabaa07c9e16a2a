"""Mistral: ``[TOOL_CALLS]`` followed by a JSON call list (v3) or ``name[ARGS]{…}`` (newer)."""

from __future__ import annotations

import json

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

_MISTRAL_TAG = "[TOOL_CALLS]"
_MISTRAL_ARGS = "[ARGS]"


@register_parser("mistral")
def parse_mistral(text: str) -> ParseResult:
    """Mistral: ``[TOOL_CALLS][{"name": …, "arguments": {…}, "id": "abc123XYZ"}, …]`` (v3), also the
    newer ``[TOOL_CALLS]name[ARGS]{…}`` form. Text before the first tag is content."""
    errors: list[str] = []
    calls: list[ToolCall] = []
    first = text.find(_MISTRAL_TAG)
    if first < 0:
        return ParseResult(content=_tidy(text))
    content = text[:first]
    pos = first
    index = 0
    while pos < len(text):
        if not text.startswith(_MISTRAL_TAG, pos):
            rest = text[pos:]
            if rest.strip():
                errors.append(f"text after the tool calls: {rest.strip()[:60]!r}")
            break
        pos = _skip_ws(text, pos + len(_MISTRAL_TAG))
        if pos >= len(text):
            errors.append(f"tool call {index}: empty {_MISTRAL_TAG}")
            break
        if text[pos] in "[{":
            try:
                obj, end = _DECODER.raw_decode(text, pos)
            except (json.JSONDecodeError, RecursionError) as e:
                errors.append(f"tool call {index}: invalid JSON after {_MISTRAL_TAG} ({_json_error(e)})")
                break
            raw_all = text[pos:end]
            items = obj if isinstance(obj, list) else [obj]
            if not items:
                errors.append(f"tool call {index}: empty call list")
            for item in items:
                raw = json.dumps(item, ensure_ascii=False)
                call = _call_from_obj(item, raw if isinstance(obj, list) else raw_all, errors, f"tool call {index}")
                if call is not None:
                    calls.append(call)
                index += 1
            pos = _skip_ws(text, end)
        else:  # name[ARGS]{...}
            a = text.find(_MISTRAL_ARGS, pos)
            if a < 0:
                errors.append(f"tool call {index}: expected JSON or name{_MISTRAL_ARGS}{{…}} after {_MISTRAL_TAG}")
                break
            name = text[pos:a].strip()
            apos = _skip_ws(text, a + len(_MISTRAL_ARGS))
            try:
                args, end = _DECODER.raw_decode(text, apos)
            except (json.JSONDecodeError, RecursionError) as e:
                errors.append(f"tool call {index}: invalid JSON arguments ({_json_error(e)})")
                break
            call = _call_from_obj({"name": name, "arguments": args}, text[apos:end], errors, f"tool call {index}")
            if call is not None:
                calls.append(call)
            index += 1
            pos = _skip_ws(text, end)
    return ParseResult(content=_tidy(content), tool_calls=calls, errors=errors)
