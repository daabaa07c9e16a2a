"""Tool-call parsers: model text -> (content, tool calls, errors).

Model output is data: parsers never raise on it and never evaluate it. Every problem becomes an
entry in ``errors`` (counted as a format error by evaluation and usable as a negative signal by
RL), and whatever could be recovered is still returned.

They also stay cheap on adversarial text (a model can emit a megabyte of brackets): every parser
is linear in the length of its input, JSON nested too deep for Python is an error rather than a
RecursionError, and calls whose arguments nest deeper than ``MAX_VALUE_DEPTH`` are dropped with
an error (nothing downstream — stores, checkers, templates — has to cope with them).

One module per family (``hermes``, ``mistral``, ``llama``, ``pythonic``, ``react``, ``deepseek``,
``xml``, ``glm``, ``nemotron``, ``cohere``, ``lfm2``, ``harmony``, ``gemma4``); each registers its parser here
by importing ``register_parser`` from ``base``. This package's namespace is the public API: the
registry, ``parse_tool_calls`` (ids, reasoning, depth limits around any parser), ``detect_parser``
and every family's ``parse_*`` function.
"""

from __future__ import annotations

from typing import Any

from trajtune.chat.parsers.base import (
    _PARSERS,
    Parser,
    ParseResult,
    _scalar_or_text,
    available_parsers,
    register_parser,
)
from trajtune.chat.parsers.cohere import parse_cohere
from trajtune.chat.parsers.deepseek import parse_deepseek
from trajtune.chat.parsers.detect import detect_parser
from trajtune.chat.parsers.gemma4 import parse_gemma4
from trajtune.chat.parsers.glm import parse_glm45
from trajtune.chat.parsers.harmony import parse_harmony
from trajtune.chat.parsers.hermes import parse_hermes
from trajtune.chat.parsers.lfm2 import parse_lfm2
from trajtune.chat.parsers.llama import parse_llama3_json
from trajtune.chat.parsers.mistral import parse_mistral
from trajtune.chat.parsers.nemotron import parse_nemotron
from trajtune.chat.parsers.pythonic import parse_pythonic
from trajtune.chat.parsers.react import parse_react
from trajtune.chat.parsers.xml import parse_xml
from trajtune.schema import MAX_VALUE_DEPTH, Message, ToolCall, depth_exceeds, fill_call_id

__all__ = [
    "ParseResult", "Parser", "assistant_message", "available_parsers", "detect_parser", "parse_cohere",
    "parse_deepseek", "parse_gemma4", "parse_glm45", "parse_harmony", "parse_hermes", "parse_lfm2", "parse_llama3_json",
    "parse_mistral", "parse_nemotron", "parse_pythonic", "parse_react", "parse_tool_calls", "parse_xml",
    "register_parser", "split_reasoning", "_PARSERS", "_scalar_or_text",
]


def assistant_message(content: str, tool_calls: list[ToolCall] | None, errors: list[str], raw: str) -> Message:
    """The assistant turn the model wrote, as parsed. Where parsing failed, the raw text is kept
    (``extra.raw_text``, beside ``extra.parse_errors``): a call that did not parse is dropped from
    the content, and without it a format error could be counted but never read."""
    extra: dict[str, Any] = {"parse_errors": errors, "raw_text": raw} if errors else {}
    return Message(role="assistant", content=content or None, tool_calls=tool_calls or None, origin="agent",
                   extra=extra)


def split_reasoning(text: str) -> tuple[str | None, str, list[str]]:
    """Split a leading ``<think>…</think>`` block off model text: (reasoning, rest, errors).

    Templates that open the block in the generation prompt leave only ``…</think>`` in the
    output; that form is accepted too. An unterminated block is all reasoning (and an error).
    """
    errors: list[str] = []
    stripped = text.lstrip()
    if stripped.startswith("<think>"):
        body = stripped[len("<think>"):]
    elif "</think>" in text and "<think>" not in text:
        body = text
    else:
        return None, text, errors
    end = body.find("</think>")
    if end < 0:
        errors.append("unterminated <think> block")
        return body.strip("\n"), "", errors
    return body[:end].strip("\n"), body[end + len("</think>"):].lstrip("\n"), errors


def parse_tool_calls(text: str, parser: str = "hermes", *, taken_ids: set[str] | None = None,
                     id_start: int = 0, reasoning: bool = False) -> ParseResult:
    """Parse ``text`` with the named parser and give every call a unique deterministic id.

    Ids follow the IR rule (``call_{ordinal:06d}``, skipping ``taken_ids``) unless the model wrote
    one itself; ``taken_ids`` is updated in place so a caller can keep ids unique per trajectory.
    With ``reasoning`` a leading ``<think>`` block goes to ``result.reasoning`` first, so calls
    the model merely considered while thinking are not executed.
    """
    if parser not in _PARSERS:
        raise KeyError(f"unknown tool-call parser {parser!r}; available: {', '.join(available_parsers())}")
    think: str | None = None
    think_errors: list[str] = []
    if reasoning:
        think, text, think_errors = split_reasoning(text)
    try:
        result = _PARSERS[parser](text)
    except Exception as e:  # a parser bug must not take down a rollout; report it as a format error
        result = ParseResult(content=text, errors=[f"parser {parser!r} failed: {type(e).__name__}: {e}"])
    if think is not None:  # else keep what the parser read (harmony analysis, Cohere thinking)
        result.reasoning = think
    result.errors[:0] = think_errors
    _drop_too_deep(result)
    taken = taken_ids if taken_ids is not None else set()
    ordinal = id_start
    for call in result.tool_calls:
        if call.id and call.id not in taken:
            taken.add(call.id)
            continue
        ordinal = fill_call_id(call, taken, ordinal)
    return result


def _drop_too_deep(result: ParseResult) -> None:
    """Drop (and report) calls whose arguments nest deeper than ``MAX_VALUE_DEPTH`` levels."""
    kept = []
    for i, c in enumerate(result.tool_calls):
        if c.arguments is not None and depth_exceeds(c.arguments, MAX_VALUE_DEPTH):
            result.errors.append(f"tool call {i} ({c.name}): arguments nested deeper than {MAX_VALUE_DEPTH} levels; "
                                 "call dropped")
        else:
            kept.append(c)
    result.tool_calls = kept
