"""DeepSeek V3/R1: calls between ``<｜tool▁calls▁begin｜>`` markers, arguments in a ```json block."""

from __future__ import annotations

import json

from trajtune.chat.parsers.base import ParseResult, _call_from_obj, _json_error, _tidy, register_parser
from trajtune.schema import ToolCall

_DS_CALLS_BEGIN, _DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_DS_CALL_BEGIN, _DS_CALL_END, _DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def _ds_call(piece: str) -> tuple[str, str] | None:
    """``(name, raw arguments)`` of one DeepSeek call: ``function<sep>name\n```json\n{…}\n`````.

    Plain string operations rather than one regex: a lazy regex over this shape backtracks
    quadratically (or worse) on long runs of whitespace, which a model can emit."""
    head, sep, rest = piece.partition(_DS_SEP)
    if not sep or head.strip() not in ("", "function"):
        return None
    name, nl, body = rest.lstrip().partition("\n")
    name, body = name.strip(), body.strip()
    if not nl or not name or not body.startswith("```") or len(body) < 6 or not body.endswith("```"):
        return None
    inner = body[3:-3]
    if inner.startswith("json"):
        inner = inner[4:]
    return name, inner.strip()


@register_parser("deepseek")
def parse_deepseek(text: str) -> ParseResult:
    """DeepSeek V3/R1: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name
    ```json {…} ```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>``."""
    errors: list[str] = []
    calls: list[ToolCall] = []
    start = text.find(_DS_CALLS_BEGIN)
    if start < 0:
        return ParseResult(content=_tidy(text))
    content = text[:start]
    end = text.find(_DS_CALLS_END, start)
    if end < 0:
        errors.append(f"unterminated {_DS_CALLS_BEGIN}")
        block = text[start + len(_DS_CALLS_BEGIN):]
    else:
        block = text[start + len(_DS_CALLS_BEGIN):end]
        rest = text[end + len(_DS_CALLS_END):]
        if rest.strip():
            errors.append(f"text after the tool calls: {rest.strip()[:60]!r}")
    pieces = block.split(_DS_CALL_BEGIN)
    if pieces[0].strip():
        errors.append("text inside the call block outside any call")
    if len(pieces) == 1:
        errors.append("empty call block")
    for i, piece in enumerate(pieces[1:]):
        where = f"tool call {i}"
        if _DS_CALL_END in piece:
            piece = piece[:piece.index(_DS_CALL_END)]
        else:
            errors.append(f"{where}: unterminated {_DS_CALL_BEGIN}")
        parts = _ds_call(piece)
        if parts is None:
            errors.append(f"{where}: expected function{_DS_SEP}name followed by a ```json block")
            continue
        name, raw = parts
        try:
            args = json.loads(raw) if raw else {}
        except (json.JSONDecodeError, RecursionError) as e:
            errors.append(f"{where}: invalid JSON arguments ({_json_error(e)})")
            continue
        call = _call_from_obj({"name": name, "arguments": args}, raw, errors, where)
        if call is not None:
            calls.append(call)
    return ParseResult(content=_tidy(content), tool_calls=calls, errors=errors)
