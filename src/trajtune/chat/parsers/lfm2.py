"""LFM2 (Liquid): pythonic or JSON call lists between ``<|tool_call_start|>`` and ``<|tool_call_end|>``."""

from __future__ import annotations

from trajtune.chat.parsers.base import ParseResult, _json_calls, _tidy, marked_blocks, register_parser
from trajtune.chat.parsers.pythonic import parse_pythonic
from trajtune.schema import ToolCall

_LFM_OPEN, _LFM_CLOSE = "<|tool_call_start|>", "<|tool_call_end|>"


@register_parser("lfm2")
def parse_lfm2(text: str) -> ParseResult:
    """LFM2: ``<|tool_call_start|>[f(a=1), g(b="x")]<|tool_call_end|>`` (pythonic, read by the
    ``pythonic`` parser: nothing is evaluated) or a JSON list of ``{"name", "arguments"}`` in the
    same markers. Text outside the markers is content."""
    errors: list[str] = []
    calls: list[ToolCall] = []
    content: list[str] = []
    for where, inner, closed in marked_blocks(text, _LFM_OPEN, _LFM_CLOSE, content, "call block"):
        if not closed:  # a cut-off call list is reported, never executed
            errors.append(f"{where}: unterminated {_LFM_OPEN}")
            continue
        body = inner.strip()
        if body.startswith(("[{", "{")):
            calls += _json_calls(body, where, errors)
            continue
        sub = parse_pythonic(body)
        errors += [f"{where}: {e}" for e in sub.errors]
        if not sub.tool_calls and not sub.errors:
            errors.append(f"{where}: expected a call list like [f(a=1)]")
        elif sub.content:
            errors.append(f"{where}: text inside the call block: {sub.content[:60]!r}")
        calls += sub.tool_calls
    if _LFM_CLOSE in content[-1]:
        errors.append(f"stray {_LFM_CLOSE} without an opening marker")
    return ParseResult(content=_tidy("".join(content)), tool_calls=calls, errors=errors)
