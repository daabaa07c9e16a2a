"""Where a tool call's name ends and its arguments end, in the text of one assistant turn.

Why a module of its own: DualTune (docs/algorithms.md) trains one adapter on the tool *name* and
another on the *arguments*, and at inference switches adapters at the very same place. Training
(which token belongs to which adapter) and decoding (when to switch) both call ``call_splits`` on
the turn's text, so the two can never disagree about where a name ends.

The scanner reads the JSON-object call convention shared by Hermes / Qwen ``<tool_call>`` blocks,
Llama 3 JSON calls, Mistral ``[TOOL_CALLS]`` lists and trajtune's tiny models: an object whose
``"name": "<tool>"`` key comes before its arguments. A split is:

- ``name_end``: the index of the closing quote of the name string; the name is known once that
  quote is written, so the token that writes it is the last one the selector produces;
- ``args_end``: the index of the ``}`` that closes the call object (``None`` while it is still
  open, e.g. in a truncated turn); the token that writes it is the last argument token.

Model output is data: the scanner never evaluates it and is linear in its length (one pass per
call, strings and escapes respected when balancing braces).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class CallSplit:
    """One call in a turn's text: its name, where the name's characters lie, where the call closes."""

    name: str
    name_start: int  # index of the first character of the name (after the opening quote)
    name_end: int  # index of the closing quote of the name
    args_end: int | None  # index of the call object's closing brace; None while the object is open


def _closing_brace(text: str, start: int) -> int | None:
    """Index of the ``}`` balancing the ``{`` at ``start`` (strings and escapes respected), or None."""
    depth = 0
    in_str = esc = False
    for i in range(start, len(text)):
        ch = text[i]
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def _decode_name(raw: str) -> str:
    try:
        return str(json.loads(f'"{raw}"'))
    except json.JSONDecodeError:
        return raw


def call_splits(text: str) -> list[CallSplit]:
    """The calls of one assistant turn's text, in order (see the module docstring).

    Scanning stops at a call whose object is still open: everything after its name is its
    arguments. A ``"name"`` key with no ``{`` before it (not a JSON-object call) closes nowhere
    and is treated the same way."""
    out: list[CallSplit] = []
    pos = 0
    while True:
        m = _NAME.search(text, pos)
        if m is None:
            return out
        obj = text.rfind("{", pos, m.start())
        close = _closing_brace(text, obj) if obj >= 0 else None
        if close is not None and close < m.end():  # that object closed before the name: not a call object
            close = None
        out.append(CallSplit(_decode_name(m.group(1)), m.start(1), m.end() - 1, close))
        if close is None:
            return out
        pos = close + 1
