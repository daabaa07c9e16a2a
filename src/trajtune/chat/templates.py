"""Per-family adaptations that real chat templates need before they can render a conversation.

Why a separate module: each helper encodes one quirk of one template family (Mistral's 9-character
call ids, where reasoning goes, which string closes an assistant turn). Keeping them here keeps the
renderer generic: it asks *what this template needs* and never special-cases a model by name.
"""

from __future__ import annotations

import hashlib
import re
import string
from typing import Any

_ALNUM = string.ascii_letters + string.digits
_MISTRAL_ID = re.compile(r"^[A-Za-z0-9]{9}$")

# Strings that reveal what a template expects. Matching the template *source* (not a model name)
# means a fine-tune that keeps its parent's template is recognised too.
_MISTRAL_ID_HINTS = ("[TOOL_CALLS]", "length 9", "alphanumeric strings with length 9")


def template_source(tokenizer: Any, chat_template: str | None = None) -> str:
    """The template text a render will use (a dict of named templates yields the default one)."""
    t = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
    if isinstance(t, dict):
        t = t.get("tool_use") or t.get("default") or next(iter(t.values()), "")
    return t or ""


def needs_mistral_ids(template: str) -> bool:
    """Mistral-family templates reject tool-call ids that are not 9 alphanumeric characters."""
    return any(h in template for h in _MISTRAL_ID_HINTS)


def mistral_call_id(original: str, salt: int = 0) -> str:
    """A deterministic 9-character alphanumeric id for ``original`` (stable across runs and hosts)."""
    n = int.from_bytes(hashlib.sha256(f"{original}\x00{salt}".encode()).digest(), "big")
    out = []
    for _ in range(9):
        n, r = divmod(n, 62)
        out.append(_ALNUM[r])
    return "".join(out)


def adapt_call_ids(messages: list[Any], style: str) -> dict[str, str]:
    """Map every call id in ``messages`` (IR Messages) to the id the template accepts.

    The map is built in order of appearance and only ever grows, so rendering a longer history
    (a rollout that continues) maps the earlier ids to the same values: calls and their results
    stay consistent. ``style`` is ``keep`` (identity) or ``mistral`` (9 alphanumeric characters;
    ids that already qualify are kept).
    """
    mapping: dict[str, str] = {}
    if style != "mistral":
        return mapping
    used: set[str] = set()

    def add(cid: str | None) -> None:
        if cid is None or cid in mapping:
            return
        if _MISTRAL_ID.match(cid) and cid not in used:
            new = cid
        else:
            salt = 0
            new = mistral_call_id(cid, salt)
            while new in used:
                salt += 1
                new = mistral_call_id(cid, salt)
        mapping[cid] = new
        used.add(new)

    for m in messages:
        for c in getattr(m, "tool_calls", None) or []:
            add(c.id)
        add(getattr(m, "tool_call_id", None))
    return mapping


def reasoning_mode(template: str) -> str:
    """Where a template wants reasoning: ``field`` (reads ``reasoning_content``), ``inline`` (expects
    ``<think>`` inside the content, e.g. DeepSeek-R1 style), or ``drop`` (knows nothing of it)."""
    if "reasoning_content" in template:
        return "field"
    if "<think>" in template or "</think>" in template:
        return "inline"
    return "drop"


def special_strings(tokenizer: Any) -> list[str]:
    """Special and added token strings, longest first (for matching at a text position)."""
    out: set[str] = set(getattr(tokenizer, "all_special_tokens", None) or [])
    try:
        out |= set(tokenizer.get_added_vocab())
    except Exception:  # a tokenizer without added vocab is fine
        pass
    return sorted((s for s in out if s), key=len, reverse=True)


_PROBE = "Q7v-probe-answer"


def detect_end_of_turn(render: Any, tokenizer: Any) -> str | None:
    """The special token a template writes right after an assistant's content, or None.

    Why not just ``eos_token``: Gemma closes turns with ``<end_of_turn>`` (eos is ``<eos>``), Phi-3
    with ``<|end|>``, Llama-3 base tokenizers with ``<|eot_id|>`` (eos ``<|end_of_text|>``). Training
    on the wrong one teaches the model never to stop. ``render(messages, tools, gen)`` returns text.
    """
    try:
        text = render([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _PROBE}], None, False)
    except Exception:
        return None
    i = text.rfind(_PROBE)
    if i < 0:
        return None
    after = text[i + len(_PROBE):].lstrip(" \n")
    for s in special_strings(tokenizer):
        if after.startswith(s):
            return s
    return None


def inline_reasoning(reasoning: str, content: str) -> str:
    """Reasoning as the ``<think>`` block thinking models write before their answer."""
    return f"<think>\n{reasoning}\n</think>\n\n{content}"
