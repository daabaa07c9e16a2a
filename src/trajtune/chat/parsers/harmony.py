"""GPT-OSS harmony: messages with channels (analysis, commentary, final) and ``to=functions.NAME`` calls."""

from __future__ import annotations

import json
import re

from trajtune.chat.parsers.base import ParseResult, _call_from_obj, _skip_ws, _tidy, register_parser
from trajtune.schema import ToolCall

_H_START, _H_MESSAGE, _H_CHANNEL = "<|start|>", "<|message|>", "<|channel|>"
_H_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_H_CHANNEL_NAME = re.compile(re.escape(_H_CHANNEL) + r"\s*(\w+)")
_H_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


def _harmony_messages(text: str, errors: list[str]) -> list[tuple[str, str]]:
    """(header, body) pairs; the first header follows the generation prompt ``<|start|>assistant``."""
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        if text.startswith(_H_START, pos):
            pos += len(_H_START)
        elif out:
            errors.append(f"text between messages: {text[pos:].strip()[:60]!r}")
            break
        head_end = text.find(_H_MESSAGE, pos)
        if head_end < 0:
            errors.append(f"message header without {_H_MESSAGE}: {text[pos:].strip()[:60]!r}")
            break
        body_start = head_end + len(_H_MESSAGE)
        ends = [(i, s) for s in _H_ENDS + (_H_START,) if (i := text.find(s, body_start)) >= 0]
        end, marker = min(ends) if ends else (len(text), "")
        if marker == _H_START:
            errors.append(f"message not closed before the next {_H_START}")
        out.append((text[pos:head_end], text[body_start:end]))
        pos = _skip_ws(text, end + (len(marker) if marker in _H_ENDS else 0))
    return out


@register_parser("harmony")
def parse_harmony(text: str) -> ParseResult:
    """GPT-OSS harmony messages after the ``<|start|>assistant`` generation prompt:
    ``<|channel|>analysis<|message|>…<|end|>`` (reasoning), ``<|start|>assistant
    to=functions.NAME<|channel|>commentary json<|message|>{…}<|call|>`` (a call; ``to=`` may also
    follow the channel, as the model often writes it), ``<|channel|>final<|message|>…`` (content).
    Text without any harmony marker is plain content."""
    if _H_MESSAGE not in text and _H_CHANNEL not in text:
        return ParseResult(content=_tidy(text))
    errors: list[str] = []
    calls: list[ToolCall] = []
    content: list[str] = []
    analysis: list[str] = []
    for k, (header, body) in enumerate(_harmony_messages(text, errors)):
        where = f"message {k}"
        role = header.split(_H_CHANNEL)[0].split("to=")[0].strip()
        if role not in ("", "assistant"):
            errors.append(f"{where}: the model wrote a message as {role!r}")
            continue
        channel = _H_CHANNEL_NAME.search(header)
        recipient = _H_RECIPIENT.search(header)
        if recipient is not None:
            name = recipient.group(1).removeprefix("functions.")
            raw = body.strip()
            try:
                args = json.loads(raw) if raw else {}
            except (json.JSONDecodeError, RecursionError):
                errors.append(f"{where}: invalid JSON arguments for {name!r}")
                continue
            call = _call_from_obj({"name": name, "arguments": args}, raw, errors, where)
            if call is not None:
                calls.append(call)
        elif channel is None:
            errors.append(f"{where}: message without a channel")
            content.append(body)
        elif channel.group(1) == "analysis":
            analysis.append(body)
        else:  # final, or a commentary preamble addressed to the user
            content.append(body)
    return ParseResult(content=_tidy("".join(content)), tool_calls=calls, errors=errors,
                       reasoning="\n".join(analysis) if analysis else None)
