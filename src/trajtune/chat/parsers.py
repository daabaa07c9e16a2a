"""Tool-call parsers: model text -> (content, tool calls, errors).

Model output is data: parsers never raise on it and never evaluate it. Every problem becomes an
entry in ``errors`` (counted as a format error by evaluation and usable as a negative signal by
RL), and whatever could be recovered is still returned.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trajtune.schema import ToolCall


@dataclass
class ParseResult:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


Parser = Callable[[str], ParseResult]
_PARSERS: dict[str, Parser] = {}


def register_parser(name: str) -> Callable[[Parser], Parser]:
    def deco(fn: Parser) -> Parser:
        _PARSERS[name] = fn
        return fn

    return deco


def available_parsers() -> list[str]:
    return sorted(_PARSERS)


def parse_tool_calls(text: str, parser: str = "hermes", *, taken_ids: set[str] | None = None,
                     id_start: int = 0) -> ParseResult:
    """Parse ``text`` with the named parser and give every call a unique deterministic id.

    Ids follow the IR rule (``call_{ordinal:06d}``, skipping ``taken_ids``) unless the model wrote
    one itself; ``taken_ids`` is updated in place so a caller can keep ids unique per trajectory.
    """
    if parser not in _PARSERS:
        raise KeyError(f"unknown tool-call parser {parser!r}; available: {', '.join(available_parsers())}")
    try:
        result = _PARSERS[parser](text)
    except Exception as e:  # a parser bug must not take down a rollout; report it as a format error
        result = ParseResult(content=text, errors=[f"parser {parser!r} failed: {type(e).__name__}: {e}"])
    taken = taken_ids if taken_ids is not None else set()
    ordinal = id_start
    for call in result.tool_calls:
        if call.id and call.id not in taken:
            taken.add(call.id)
            continue
        while f"call_{ordinal:06d}" in taken:
            ordinal += 1
        call.id = f"call_{ordinal:06d}"
        call.id_generated = True
        taken.add(call.id)
        ordinal += 1
    return result


def _call_from_obj(obj: Any, raw: str, errors: list[str], where: str) -> ToolCall | None:
    """Build a ToolCall from a decoded ``{"name", "arguments"}`` object, reporting what is off."""
    if not isinstance(obj, dict):
        errors.append(f"{where}: expected a JSON object, got {type(obj).__name__}")
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        errors.append(f"{where}: missing or non-string 'name'")
        return None
    args: Any = obj.get("arguments", obj.get("parameters", {}))
    if args is None:
        args = {}
    if isinstance(args, str):
        # The OpenAI string form inside a Hermes block: double-encoded. Recover, but report it.
        try:
            decoded = json.loads(args)
        except json.JSONDecodeError:
            errors.append(f"{where}: 'arguments' is a string that is not JSON")
            return ToolCall(id="", name=name, arguments=None, arguments_raw=args)
        errors.append(f"{where}: 'arguments' is double-encoded (a JSON string holding JSON)")
        args = decoded
    if not isinstance(args, dict):
        errors.append(f"{where}: 'arguments' must be a JSON object, got {type(args).__name__}")
        return ToolCall(id="", name=name, arguments=None, arguments_raw=json.dumps(args, ensure_ascii=False))
    call_id = obj.get("id") if isinstance(obj.get("id"), str) and obj.get("id") else ""
    return ToolCall(id=call_id, name=name, arguments=args, arguments_raw=raw)


_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"


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
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as e:
                errors.append(f"{where}: invalid JSON ({e.msg} at column {e.colno})")
            else:
                call = _call_from_obj(obj, raw, errors, where)
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
