"""GLM-4.5/4.6: ``<tool_call>NAME`` followed by ``<arg_key>``/``<arg_value>`` pairs."""

from __future__ import annotations

import re
from typing import Any

from trajtune.chat.parsers.base import ParseResult, _scalar_or_text, _tidy, _TooDeep, marked_blocks, register_parser
from trajtune.chat.parsers.hermes import _HERMES_CLOSE, _HERMES_OPEN
from trajtune.schema import MAX_VALUE_DEPTH, ToolCall

_GLM_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


@register_parser("glm45")
def parse_glm45(text: str) -> ParseResult:
    """GLM-4.5/4.6: ``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n…
    </tool_call>`` per call; values follow :func:`_scalar_or_text`. Text outside is content."""
    errors: list[str] = []
    calls: list[ToolCall] = []
    content: list[str] = []
    for where, body, closed in marked_blocks(text, _HERMES_OPEN, _HERMES_CLOSE, content):
        if not closed:
            errors.append(f"{where}: unterminated {_HERMES_OPEN}")
        cut = min((i for i in (body.find("<arg_key>"), body.find("\n")) if i >= 0), default=len(body))
        name, rest = body[:cut].strip(), body[cut:]
        if not re.fullmatch(r"[^\s<>{}\[\]\"]+", name):
            errors.append(f"{where}: expected a function name after {_HERMES_OPEN}, got {name[:40]!r}")
            continue
        args: dict[str, Any] = {}
        at = 0
        deep = False
        while (m := _GLM_PAIR.match(rest, at)) is not None and m.group(1).strip() not in args:
            try:
                args[m.group(1).strip()] = _scalar_or_text(m.group(2))
            except _TooDeep:
                errors.append(f"{where}: argument {m.group(1).strip()!r} is nested deeper than {MAX_VALUE_DEPTH} levels")
                deep = True
                break
            at = m.end()
        if deep:
            continue
        if rest[at:].strip():  # also a repeated key: the pair is left unread
            errors.append(f"{where}: expected <arg_key>K</arg_key><arg_value>V</arg_value> pairs, "
                          f"got {rest[at:].strip()[:60]!r}")
            continue
        if closed:  # a cut-off call may lack arguments: reported, not executed
            calls.append(ToolCall(id="", name=name, arguments=args, arguments_raw=rest.strip()))
    return ParseResult(content=_tidy("".join(content)), tool_calls=calls, errors=errors)
