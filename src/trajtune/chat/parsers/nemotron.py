"""Llama-Nemotron: ``<TOOLCALL>[{"name": …, "arguments": {…}}, …]</TOOLCALL>`` after the content."""

from __future__ import annotations

from trajtune.chat.parsers.base import ParseResult, _between, _json_calls, _tidy, register_parser

_TOOLCALL_OPEN, _TOOLCALL_CLOSE = "<TOOLCALL>", "</TOOLCALL>"


@register_parser("nemotron")
def parse_nemotron(text: str) -> ParseResult:
    """Llama-Nemotron: content, then ``<TOOLCALL>[{"name": …, "arguments": {…}}, …]</TOOLCALL>``."""
    errors: list[str] = []
    start = text.find(_TOOLCALL_OPEN)
    if start < 0:
        return ParseResult(content=_tidy(text))
    raw, end, closed = _between(text, start + len(_TOOLCALL_OPEN), _TOOLCALL_CLOSE)
    if not closed:
        errors.append(f"unterminated {_TOOLCALL_OPEN}")
    elif text[end:].strip():
        errors.append(f"text after {_TOOLCALL_CLOSE}: {text[end:].strip()[:60]!r}")
    calls = _json_calls(raw.strip(), "tool call", errors) if closed else []
    return ParseResult(content=_tidy(text[:start]), tool_calls=calls, errors=errors)
