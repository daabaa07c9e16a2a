"""Command R7B / Command A: thinking, action and response blocks."""

from __future__ import annotations

from trajtune.chat.parsers.base import ParseResult, _between, _json_calls, _tidy, register_parser

_COHERE_BLOCKS = {"thinking": ("<|START_THINKING|>", "<|END_THINKING|>"),
                  "action": ("<|START_ACTION|>", "<|END_ACTION|>"),
                  "response": ("<|START_RESPONSE|>", "<|END_RESPONSE|>")}


@register_parser("cohere")
def parse_cohere(text: str) -> ParseResult:
    """Command R7B / Command A: ``<|START_THINKING|>…<|END_THINKING|>`` (reasoning), then
    ``<|START_ACTION|>[{"tool_call_id": "0", "tool_name": …, "parameters": {…}}]<|END_ACTION|>``
    or ``<|START_RESPONSE|>…<|END_RESPONSE|>`` (content). The model's ``tool_call_id`` ordinals
    are kept as call ids. Text outside the blocks is content, reported when a response block
    exists too."""
    errors: list[str] = []
    found: dict[str, str] = {}
    outside: list[str] = []
    pos = 0
    while True:
        hits = [(i, k) for k, (o, _) in _COHERE_BLOCKS.items() if (i := text.find(o, pos)) >= 0]
        if not hits:
            outside.append(text[pos:])
            break
        start, kind = min(hits)
        outside.append(text[pos:start])
        opener, closer = _COHERE_BLOCKS[kind]
        body, pos, closed = _between(text, start + len(opener), closer)
        if not closed:
            errors.append(f"unterminated {opener}")
            if kind == "action":  # a cut-off call list is reported, never executed
                continue
        if kind in found:
            errors.append(f"more than one {opener} block")
        found[kind] = found.get(kind, "") + body
    rest = "".join(outside)
    calls = _json_calls(found["action"].strip(), "tool call", errors, "tool_name", "parameters",
                        "tool_call_id") if "action" in found else []
    if "response" in found and rest.strip():
        errors.append(f"text outside the response block: {rest.strip()[:60]!r}")
    content = found.get("response", rest)
    return ParseResult(content=_tidy(content), tool_calls=calls, errors=errors, reasoning=found.get("thinking"))
