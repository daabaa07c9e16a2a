"""Qwen3-Coder / Qwen3.5: ``<function=NAME><parameter=P>VALUE</parameter></function>`` blocks."""

from __future__ import annotations

import re
from typing import Any

from trajtune.chat.parsers.base import (
    ParseResult,
    _between,
    _scalar_or_text,
    _skip_ws,
    _tidy,
    _TooDeep,
    register_parser,
)
from trajtune.chat.parsers.hermes import _HERMES_CLOSE, _HERMES_OPEN
from trajtune.schema import MAX_VALUE_DEPTH, ToolCall

_XML_FUNCTION = "<function="
_XML_PARAM = re.compile(r"<parameter=([^>\n]*)>")


def _xml_params(body: str, where: str, errors: list[str]) -> dict[str, Any] | None:
    args: dict[str, Any] = {}
    pos = 0
    while True:
        m = _XML_PARAM.search(body, pos)
        stray = body[pos:m.start() if m else len(body)].strip()
        if stray:
            errors.append(f"{where}: text outside <parameter=…>: {stray[:60]!r}")
            return None
        if m is None:
            return args
        raw, pos, closed = _between(body, m.end(), "</parameter>")
        name = m.group(1).strip()
        if not closed:
            errors.append(f"{where}: unterminated <parameter={name}>")
            return None
        if not name or name in args:
            errors.append(f"{where}: {'duplicate' if name else 'empty'} parameter name {name!r}")
            return None
        raw = raw[1:] if raw.startswith("\n") else raw  # the template writes "\n" + value + "\n"
        try:
            args[name] = _scalar_or_text(raw[:-1] if raw.endswith("\n") else raw)
        except _TooDeep:
            errors.append(f"{where}: parameter {name!r} is nested deeper than {MAX_VALUE_DEPTH} levels")
            return None


@register_parser("xml")
def parse_xml(text: str) -> ParseResult:
    """Qwen3-Coder / Qwen3.5: ``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>
    \\n</function>\\n</tool_call>``, one block per call, the outer ``<tool_call>`` optional. Values
    follow :func:`_scalar_or_text`. Text outside the blocks is content."""
    errors: list[str] = []
    calls: list[ToolCall] = []
    content: list[str] = []
    pos = 0
    index = 0
    while (start := text.find(_XML_FUNCTION, pos)) >= 0:
        where = f"tool call {index}"
        index += 1
        before = text[pos:start]
        wrapped = before.rstrip().endswith(_HERMES_OPEN)
        content.append(before.rstrip()[: -len(_HERMES_OPEN)] if wrapped else before)
        head_end = text.find(">", start)
        name = text[start + len(_XML_FUNCTION):head_end].strip() if head_end >= 0 else ""
        if head_end < 0 or not name or "\n" in name:
            errors.append(f"{where}: unterminated or empty <function=…> tag")
            return ParseResult(content=_tidy("".join(content)), tool_calls=calls, errors=errors)
        body, pos, closed = _between(text, head_end + 1, "</function>")
        if not closed:
            errors.append(f"{where}: unterminated <function={name}>")
        elif wrapped:
            rest = _skip_ws(text, pos)
            closed = text.startswith(_HERMES_CLOSE, rest)
            if closed:
                pos = rest + len(_HERMES_CLOSE)
            else:
                errors.append(f"{where}: unterminated {_HERMES_OPEN}")
        args = _xml_params(body, where, errors)
        if args is not None and closed:  # a cut-off call may lack parameters: reported, not executed
            calls.append(ToolCall(id="", name=name, arguments=args, arguments_raw=body.strip()))
    rest = text[pos:]
    content.append(rest)
    for tag in (_HERMES_OPEN, _HERMES_CLOSE):
        if tag in rest:
            errors.append(f"stray {tag} without a <function=…> block")
    return ParseResult(content=_tidy("".join(content)), tool_calls=calls, errors=errors)
