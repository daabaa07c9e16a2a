"""What a chat template can render, found by rendering small probe conversations through it.

Why probe instead of reading the template source: real templates hide their behaviour in
conditions, macros and comments. Gemma 1 raises on a ``system`` message, Idefics reads content
only as a list of parts (a plain string renders as nothing), SmolLM2 prints any role but drops
``tools`` and ``tool_calls``, DeepSeek concatenates ``arguments`` as a string. Rendering a probe
with unique marker strings and looking for the markers answers each question directly, for any
template, and ``trajtune doctor`` can say what was found.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from trajtune.chat.templates import strip_jinja_comments

Render = Callable[[list[dict[str, Any]], Any, bool], str]

_SYS, _U1, _U2, _ANS, _REASON = ("Zq1 system note", "Zq2 user asks", "Zq3 user again", "Zq4 answer text",
                                  "Zq5 reasoning text")
PROBE_RESULT = "Zq6 tool result"
PROBE_TOOL_NAME, PROBE_TOOL_DESC = "zq_probe_lookup", "Zq8 looks up a probe value."
PROBE_ARG_VALUE = "Zq7-argument"
_RESULT, _ARG_VALUE = PROBE_RESULT, PROBE_ARG_VALUE
PROBE_CALL_ID = "zqCall001"  # 9 alphanumeric characters: the strictest id rule (Mistral) accepts it
PROBE_TOOL = {"type": "function", "function": {
    "name": PROBE_TOOL_NAME, "description": PROBE_TOOL_DESC,
    "parameters": {"type": "object", "properties": {"zq_key": {"type": "string"}}, "required": ["zq_key"]}}}


@dataclass
class TemplateProfile:
    """How conversations must be shaped for one template. Each field has the value trajtune uses; the
    ``notes`` say, in words, every adaptation away from passing messages through unchanged."""

    content: Literal["string", "parts"] = "string"
    system_role: Literal["native", "fold"] = "native"
    alternation: bool = False  # consecutive user-side messages must be merged
    arguments: Literal["dict", "string"] = "dict"
    tool_role: Literal["native", "user"] = "native"
    reasoning_field: str | None = "reasoning_content"  # the message key a template reads reasoning from
    tools_rendered: bool = True  # ``tools=`` reaches the prompt
    calls_rendered: bool = True  # ``tool_calls`` reach the assistant turn
    notes: list[str] = field(default_factory=list)


def _safe(render: Render, msgs: list[dict[str, Any]], tools: Any = None, gen: bool = False) -> str | None:
    try:
        return render(msgs, tools, gen)
    except Exception:  # a refusal (raise_exception) or a template error: the answer is "no"
        return None


def _has(text: str | None, *needles: str) -> bool:
    return text is not None and all(n in text for n in needles)


def probe_call(arguments: Literal["dict", "string"]) -> dict[str, Any]:
    args: Any = {"zq_key": _ARG_VALUE}
    if arguments == "string":
        args = json.dumps(args)
    return {"id": PROBE_CALL_ID, "type": "function", "function": {"name": PROBE_TOOL_NAME, "arguments": args}}


def probe_template(render: Render) -> TemplateProfile:
    """Measure what a template renders; ``render(messages, tools, add_generation_prompt)`` -> text."""
    p = TemplateProfile()

    def wrap(text: str) -> Any:
        return [{"type": "text", "text": text}] if p.content == "parts" else text

    def msg(role: str, text: str, **extra: Any) -> dict[str, Any]:
        return {"role": role, "content": wrap(text), **extra}

    # content: a plain string, or only a list of parts?
    if not _has(_safe(render, [msg("user", _U1)]), _U1):
        p.content = "parts"
        if _has(_safe(render, [msg("user", _U1)]), _U1):
            p.notes.append("message content is passed as a list of text parts (the template ignores plain strings)")
        else:
            p.content = "string"
    # system role
    if not _has(_safe(render, [msg("system", _SYS), msg("user", _U1)]), _SYS, _U1):
        p.system_role = "fold"
        p.notes.append("the template refuses or drops a system message: the system prompt is folded into the first "
                       "user turn")
    # strict alternation
    if not _has(_safe(render, [msg("user", _U1), msg("user", _U2)]), _U1, _U2):
        p.alternation = True
        p.notes.append("the template requires strict user/assistant alternation: consecutive user-side messages "
                       "(tool results, then a user turn) are merged into one")
    # tools and calls
    # (with a system message where the template takes one: some only list tools inside it)
    lead = [msg("system", _SYS)] if p.system_role == "native" else []
    p.tools_rendered = _has(_safe(render, lead + [msg("user", _U1)], [PROBE_TOOL], True), PROBE_TOOL_NAME,
                            PROBE_TOOL_DESC)
    p.calls_rendered = False
    for mode in ("dict", "string"):
        text = _safe(render, [msg("user", _U1), msg("assistant", "", tool_calls=[probe_call(mode)])], [PROBE_TOOL])
        if _has(text, PROBE_TOOL_NAME, _ARG_VALUE) and f"'{_ARG_VALUE}'" not in (text or ""):
            p.arguments, p.calls_rendered = mode, True  # type: ignore[assignment]
            break
    if p.calls_rendered and p.arguments == "string":
        p.notes.append("the template prints tool-call arguments as given: they are passed as a JSON string")
    # reasoning
    p.reasoning_field = None
    for key in ("reasoning_content", "thinking"):
        answer = _safe(render, [msg("user", _U1), msg("assistant", _ANS, **{key: _REASON})])
        # (some templates render reasoning only beside a call: Command R7B's <|START_THINKING|>)
        call = _safe(render, [msg("user", _U1), msg("assistant", "", tool_calls=[probe_call(p.arguments)],
                                                     **{key: _REASON})], [PROBE_TOOL]) if p.calls_rendered else None
        if _has(answer, _REASON, _ANS) or _has(call, _REASON, PROBE_TOOL_NAME):
            p.reasoning_field = key
            break
    if p.reasoning_field == "thinking":
        p.notes.append("reasoning is passed as the message's `thinking` field")
    return p


def probe_tool_role(render: Render, p: TemplateProfile, assistant: dict[str, Any], tools: Any,
                    text_format: bool) -> None:
    """Decide how tool results reach the template, given how the assistant turn before them is shaped.

    ``text_format``: results are wrapped by a text tool format (not by the template), so rendering
    them as user turns loses nothing the template would add."""

    def wrap(text: str) -> Any:
        return [{"type": "text", "text": text}] if p.content == "parts" else text

    tool_msg = {"role": "tool", "tool_call_id": PROBE_CALL_ID, "content": wrap(_RESULT)}
    user = {"role": "user", "content": wrap(_U1)}
    text = _safe(render, [user, assistant, tool_msg], tools)
    if not _has(text, _RESULT):
        p.tool_role = "user"
        p.notes.append("the template refuses or drops `tool` messages: tool results are rendered as user turns")
        return
    p.tool_role = "native"
    if p.alternation and text_format:
        # A user turn right after a tool result: does the alternation count the result as the user
        # side (Gemma: then only merging it into the user turn renders), or skip it (Mistral)?
        again = {"role": "user", "content": wrap(_U2)}
        merged = {"role": "user", "content": wrap(f"{_RESULT}\n\n{_U2}")}
        if not _has(_safe(render, [user, assistant, tool_msg, again], tools), _RESULT, _U2) and \
                _has(_safe(render, [user, assistant, merged], tools), _RESULT, _U2):
            p.tool_role = "user"
            p.notes.append("under strict alternation a tool result counts as the user's turn: tool results are "
                           "rendered as user turns and merged with a user message that follows")


def reasoning_inline(template: str) -> bool:
    """Templates that expect ``<think>`` inside the content (DeepSeek-R1 style); comments don't count."""
    code = strip_jinja_comments(template)
    return "<think>" in code or "</think>" in code
