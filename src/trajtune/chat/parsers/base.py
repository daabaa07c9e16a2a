"""What every tool-call parser shares: the result type, the registry, and the small readers
several families use (a ``{"name", "arguments"}`` object, a JSON list of calls, a value that is a
string unless it decodes as JSON). A family's own syntax lives in its own module."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from trajtune.schema import ToolCall


@dataclass
class ParseResult:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reasoning: str | None = None

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


def _json_error(e: Exception) -> str:
    """What went wrong decoding JSON, for an error message (RecursionError: too deep for Python)."""
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} at column {e.colno}"
    return "nested too deep"


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
        except (json.JSONDecodeError, RecursionError):
            errors.append(f"{where}: 'arguments' is a string that is not JSON")
            return ToolCall(id="", name=name, arguments=None, arguments_raw=args)
        errors.append(f"{where}: 'arguments' is double-encoded (a JSON string holding JSON)")
        args = decoded
    if not isinstance(args, dict):
        errors.append(f"{where}: 'arguments' must be a JSON object, got {type(args).__name__}")
        return ToolCall(id="", name=name, arguments=None, arguments_raw=json.dumps(args, ensure_ascii=False))
    call_id = obj.get("id") if isinstance(obj.get("id"), str) and obj.get("id") else ""
    return ToolCall(id=call_id, name=name, arguments=args, arguments_raw=raw)


def _tidy(content: str) -> str:
    return re.sub(r"\n{3,}", "\n\n", content).strip()


_DECODER = json.JSONDecoder()


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


# -- shared by the XML-ish formats ------------------------------------------------------------

def _scalar_or_text(raw: str) -> Any:
    """A parameter value from a template that writes strings raw and everything else as JSON.

    A value that decodes as JSON to something other than a string (number, boolean, null,
    object, array) is decoded; anything else stays the text itself. Without the tool's schema
    this is ambiguous: a string parameter whose text is ``42`` or ``true`` comes back as a number
    or a boolean. (Qwen3-Coder's template writes booleans with Python's ``str``, ``True``: that
    stays the string "True".)
    """
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return raw
    except RecursionError:  # JSON nested beyond what Python decodes: certainly not a plain string
        raise _TooDeep from None
    return raw if isinstance(value, str) else value


class _TooDeep(ValueError):
    """A value nested too deep to decode (reported by the caller as a format error)."""


def _between(text: str, start: int, close: str) -> tuple[str, int, bool]:
    """(text up to ``close``, position after it, whether it was found); unfound: the rest."""
    end = text.find(close, start)
    if end < 0:
        return text[start:], len(text), False
    return text[start:end], end + len(close), True


def marked_blocks(text: str, open_: str, close: str, content: list[str],
                  label: str = "tool call") -> Iterator[tuple[str, str, bool]]:
    """``(where, body, closed)`` for each ``open_ … close`` block of ``text``, in order, appending the
    text around the blocks to ``content`` (the text after the last one when the loop ends). Why one
    walker: families whose calls sit between markers differ only in how a block's body reads, and
    each copy of this loop was a place to get the cut-off block or the trailing text wrong. An
    unterminated block is the last one (its body runs to the end of ``text``)."""
    pos = 0
    index = 0
    while (start := text.find(open_, pos)) >= 0:
        content.append(text[pos:start])
        body, pos, closed = _between(text, start + len(open_), close)
        yield f"{label} {index}", body, closed
        index += 1
    content.append(text[pos:])


def _json_calls(raw: str, where: str, errors: list[str], name_key: str = "name",
                args_key: str = "arguments", id_key: str = "id") -> list[ToolCall]:
    """Calls from a JSON list of objects (one object is accepted, and reported)."""
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as e:
        errors.append(f"{where}: invalid JSON ({getattr(e, 'msg', type(e).__name__)})")
        return []
    if isinstance(obj, dict):
        errors.append(f"{where}: expected a JSON list of calls, got one object")
        obj = [obj]
    if not isinstance(obj, list) or not obj:
        errors.append(f"{where}: expected a non-empty JSON list of calls")
        return []
    calls: list[ToolCall] = []
    for k, item in enumerate(obj):
        if isinstance(item, dict):
            cid = item.get(id_key)
            item = {"name": item.get(name_key), "arguments": item.get(args_key, {}),
                    "id": str(cid) if isinstance(cid, (str, int)) and not isinstance(cid, bool) else ""}
        call = _call_from_obj(item, json.dumps(item, ensure_ascii=False), errors, f"{where}.{k}")
        if call is not None:
            calls.append(call)
    return calls
