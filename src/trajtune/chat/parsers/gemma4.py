"""Gemma 4: ``<|tool_call>call:NAME{key:value,…}<tool_call|>`` blocks, reasoning in a
``<|channel>thought\\n…<channel|>`` block.

Why a reader of its own: the arguments are neither JSON nor Python. The template writes them
with its ``format_argument`` macro: strings between two ``<|"|>`` tokens with no escaping at all
(a string may hold quotes, braces and commas), booleans ``true`` / ``false``, numbers as they
are, objects as ``{key:value,…}`` with bare keys, lists as ``[value,…]``. Older template
versions print a null as ``None``, newer ones ``null``; both are read. Keys written as
``<|"|>key<|"|>`` or JSON strings, and JSON string values, are accepted too (models write them).

The reader is a small recursive descent over that grammar: it builds values, never evaluates
anything, runs in one left-to-right pass (linear in the text) and refuses nesting deeper than
``MAX_VALUE_DEPTH`` with an error instead of recursing on.
"""

from __future__ import annotations

import json
import re
from typing import Any

from trajtune.chat.parsers.base import ParseResult, _tidy, marked_blocks, register_parser
from trajtune.schema import MAX_VALUE_DEPTH, ToolCall

CALL_OPEN, CALL_CLOSE, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
RESPONSE_OPEN = "<|tool_response>"
_CHANNEL_OPEN, _CHANNEL_CLOSE = "<|channel>", "<channel|>"
_NAME = re.compile(r"call:([A-Za-z_][\w.\-]*)\{")
_BARE_KEY = re.compile(r"[A-Za-z_][\w.\-]*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_WORDS = {"true": True, "false": False, "null": None, "None": None}
_WORD = re.compile(r"true|false|null|None")
_DECODER = json.JSONDecoder()


class ArgumentError(ValueError):
    """The arguments of one call do not follow the template's syntax (the message says where)."""


class _Reader:
    """One call's ``{…}`` body, read from ``pos``; ``value()`` and ``mapping()`` advance ``pos``."""

    def __init__(self, text: str, pos: int):
        self.text, self.pos = text, pos

    def _ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1

    def _fail(self, what: str) -> ArgumentError:
        got = self.text[self.pos:self.pos + 20]
        return ArgumentError(f"expected {what} at column {self.pos}, got {got!r}" if got else
                             f"expected {what} at column {self.pos}, got the end of the call")

    def _string(self) -> str | None:
        """A ``<|"|>…<|"|>`` or a JSON string at ``pos`` (None if neither starts there)."""
        if self.text.startswith(QUOTE, self.pos):
            end = self.text.find(QUOTE, self.pos + len(QUOTE))
            if end < 0:
                raise ArgumentError(f"unterminated {QUOTE} string at column {self.pos}")
            value = self.text[self.pos + len(QUOTE):end]
            self.pos = end + len(QUOTE)
            return value
        if self.text.startswith('"', self.pos):
            try:
                value, self.pos = _DECODER.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as e:
                raise ArgumentError(f"invalid JSON string at column {self.pos} ({e.msg})") from None
            return str(value)
        return None

    def _key(self) -> str:
        key = self._string()
        if key is not None:
            return key
        m = _BARE_KEY.match(self.text, self.pos)
        if m is None:
            raise self._fail("a key")
        self.pos = m.end()
        return m.group()

    def _items(self, close: str, item: Any) -> None:
        """Comma-separated ``item()`` calls up to ``close``, with ``pos`` at the opening bracket."""
        self.pos += 1
        self._ws()
        if self.text.startswith(close, self.pos):
            self.pos += 1
            return
        while True:
            item()
            self._ws()
            if self.text.startswith(",", self.pos):
                self.pos += 1
            elif self.text.startswith(close, self.pos):
                self.pos += 1
                return
            else:
                raise self._fail(f"',' or '{close}'")

    def mapping(self, depth: int) -> dict[str, Any]:
        """``{key:value,…}`` with ``pos`` at the ``{``."""
        out: dict[str, Any] = {}

        def pair() -> None:
            self._ws()
            key = self._key()
            if key in out:
                raise ArgumentError(f"duplicate key {key!r}")
            self._ws()
            if not self.text.startswith(":", self.pos):
                raise self._fail(f"':' after the key {key!r}")
            self.pos += 1
            out[key] = self.value(depth + 1)

        self._items("}", pair)
        return out

    def _list(self, depth: int) -> list[Any]:
        out: list[Any] = []
        self._items("]", lambda: out.append(self.value(depth + 1)))
        return out

    def value(self, depth: int) -> Any:
        if depth > MAX_VALUE_DEPTH:
            raise ArgumentError(f"nested deeper than {MAX_VALUE_DEPTH} levels")
        self._ws()
        s = self._string()
        if s is not None:
            return s
        if self.text.startswith("{", self.pos):
            return self.mapping(depth)
        if self.text.startswith("[", self.pos):
            return self._list(depth)
        m = _WORD.match(self.text, self.pos) or _NUMBER.match(self.text, self.pos)
        if m is None or (m.end() < len(self.text) and (self.text[m.end()].isalnum() or self.text[m.end()] == "_")):
            raise self._fail("a value (a <|\"|>string<|\"|>, number, true, false, null, {…} or […])")
        self.pos = m.end()
        return _WORDS[m.group()] if m.group() in _WORDS else json.loads(m.group())


def read_call(body: str) -> tuple[str, dict[str, Any]]:
    """``(name, arguments)`` of one ``call:NAME{…}`` block body; ``ArgumentError`` if malformed."""
    stripped = body.strip()
    m = _NAME.match(stripped)
    if m is None:
        raise ArgumentError(f"expected call:NAME{{…}}, got {stripped[:40]!r}")
    reader = _Reader(stripped, m.end() - 1)
    args = reader.mapping(1)
    if stripped[reader.pos:].strip():
        raise ArgumentError(f"text after the arguments: {stripped[reader.pos:].strip()[:40]!r}")
    return m.group(1), args


def _thoughts(text: str, errors: list[str]) -> tuple[str, list[str]]:
    """The text without its ``<|channel>…<channel|>`` blocks, and their bodies (the reasoning)."""
    kept: list[str] = []
    thoughts: list[str] = []
    for _, body, closed in marked_blocks(text, _CHANNEL_OPEN, _CHANNEL_CLOSE, kept):
        if not closed:
            errors.append(f"unterminated {_CHANNEL_OPEN} block")
        head, nl, rest = body.partition("\n")
        thoughts.append((rest if nl and head.strip() in ("thought", "") else body).strip("\n"))
    return "".join(kept), thoughts


@register_parser("gemma4")
def parse_gemma4(text: str) -> ParseResult:
    """Gemma 4: ``<|tool_call>call:NAME{key:value,…}<tool_call|>`` per call (see the module
    docstring for the value syntax); ``<|channel>thought\\n…<channel|>`` is reasoning; other
    text is content. A cut-off call is reported, never executed."""
    errors: list[str] = []
    rest, thoughts = _thoughts(text, errors)
    calls: list[ToolCall] = []
    content: list[str] = []
    for where, body, closed in marked_blocks(rest, CALL_OPEN, CALL_CLOSE, content):
        if not closed:
            errors.append(f"{where}: unterminated {CALL_OPEN}")
            continue
        try:
            name, args = read_call(body)
        except ArgumentError as e:
            errors.append(f"{where}: {e}")
            continue
        # (no arguments_raw: the IR keeps the original only where it is JSON text)
        calls.append(ToolCall(id="", name=name, arguments=args))
    if CALL_CLOSE in content[-1]:
        errors.append(f"stray {CALL_CLOSE} without an opening {CALL_OPEN}")
    return ParseResult(content=_tidy("".join(content)), tool_calls=calls, errors=errors,
                       reasoning="\n".join(thoughts) if thoughts else None)
