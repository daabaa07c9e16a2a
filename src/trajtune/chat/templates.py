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


_JINJA_COMMENT = re.compile(r"\{#.*?#\}", re.DOTALL)


def strip_jinja_comments(template: str) -> str:
    """The template without ``{# … #}`` comments (real templates mention ``<think>`` in comments)."""
    return _JINJA_COMMENT.sub("", template)


def special_strings(tokenizer: Any) -> list[str]:
    """Special and added token strings, longest first (for matching at a text position)."""
    out: set[str] = set(getattr(tokenizer, "all_special_tokens", None) or [])
    try:
        out |= set(tokenizer.get_added_vocab())
    except Exception:  # a tokenizer without added vocab is fine
        pass
    return sorted((s for s in out if s), key=len, reverse=True)


_PROBE = "Q7v-probe-answer"
_WS = " \t\r\n"


def _run_after(text: str, pos: int, specials: list[str]) -> list[str]:
    """The special tokens at ``text[pos:]``, whitespace allowed between them."""
    run: list[str] = []
    while True:
        while pos < len(text) and text[pos] in _WS:
            pos += 1
        s = next((s for s in specials if text.startswith(s, pos)), None)
        if s is None:
            return run
        run.append(s)
        pos += len(s)


def _run_before_end(text: str, specials: list[str]) -> tuple[list[str], int]:
    """The special tokens that end ``text`` (whitespace allowed) and where that run starts."""
    run: list[str] = []
    end = len(text)
    while True:
        while end > 0 and text[end - 1] in _WS:
            end -= 1
        s = next((s for s in specials if text.endswith(s, 0, end)), None)
        if s is None:
            return run[::-1], end
        run.append(s)
        end -= len(s)


def _common_prefix(a: list[str], b: list[str]) -> list[str]:
    out = []
    for x, y in zip(a, b):
        if x != y:
            break
        out.append(x)
    return out


def closing_token(final_run: list[str], next_run: list[str],
                  stops: set[str] = frozenset()) -> tuple[str | None, bool]:
    """The string that closes a turn, from the special tokens after it when the conversation ends there
    (``final_run``) and when another message follows (``next_run``).

    The closer is the last token the two runs share: that drops what only closes the whole
    conversation (Phi-3's trailing eos) and what only opens the next message, and it keeps a real
    stop token that comes after an end-of-response marker (Cohere's ``<|END_RESPONSE|>
    <|END_OF_TURN_TOKEN|>``: the stop token is the second). Where the runs share nothing (GPT-OSS
    ends the last answer with ``<|return|>`` but earlier ones with ``<|end|>``) the first token of
    the final run closes the turn being generated. Where the shared run goes on past the model's
    stop token (``stops``: Command R7B appends the next chatbot header even to a finished
    conversation), the last stop token in it closes the turn.

    Returns ``(closer, appended)``. ``appended`` is True for templates that write no closer at
    all and let the next message's role token end the turn (GLM-4.5: ``<|user|>``,
    ``<|observation|>``): the model generates that token to stop, so the renderer trains it and
    appends it to a turn that ends the conversation.
    """
    common = _common_prefix(final_run, next_run)
    if common:
        at_stop = [s for s in common if s in stops]
        return (at_stop[-1] if at_stop else common[-1]), False
    if final_run:
        return final_run[0], False
    return (next_run[0], True) if next_run else (None, False)


def stop_strings(tokenizer: Any) -> set[str]:
    """The strings the model itself stops on: its eos token(s), as far as the tokenizer tells."""
    out = {getattr(tokenizer, "eos_token", None)}
    extra = getattr(tokenizer, "init_kwargs", {}) or {}
    out |= {extra.get("eos_token")} if isinstance(extra.get("eos_token"), str) else set()
    return {s for s in out if isinstance(s, str) and s}


def detect_end_of_turn(render: Any, tokenizer: Any, wrap: Any = None) -> tuple[str | None, bool]:
    """The special token that closes an assistant answer (or None), and whether the template leaves
    it out after the last turn (see ``closing_token``).

    Why not just ``eos_token``: Gemma closes turns with ``<end_of_turn>`` (eos is ``<eos>``), Phi-3
    with ``<|end|>``, Llama-3 base tokenizers with ``<|eot_id|>`` (eos ``<|end_of_text|>``). Training
    on the wrong one teaches the model never to stop. ``render(messages, tools, gen)`` returns text;
    ``wrap(text)`` gives message content in the form the template reads (string or parts).
    """
    w = wrap or (lambda t: t)
    specials = special_strings(tokenizer)
    try:
        last = render([{"role": "user", "content": w("Hi")}, {"role": "assistant", "content": w(_PROBE)}], None, False)
        more = render([{"role": "user", "content": w("Hi")}, {"role": "assistant", "content": w(_PROBE)},
                       {"role": "user", "content": w("Again")}], None, False)
    except Exception:
        return None, False
    i, j = last.rfind(_PROBE), more.find(_PROBE)
    if i < 0 or j < 0:
        return None, False
    return closing_token(_run_after(last, i + len(_PROBE), specials), _run_after(more, j + len(_PROBE), specials),
                         stop_strings(tokenizer))


def detect_call_end_of_turn(render: Any, tokenizer: Any, prompt: list[dict[str, Any]], call_turn: dict[str, Any],
                            result: dict[str, Any], tools: Any, marker: str, appended: bool = False) -> str | None:
    """The special token that closes an assistant turn holding a tool call, or None if the template
    writes none of its own there. GPT-OSS closes calls with ``<|call|>`` and answers with ``<|return|>``.

    ``marker`` is a string inside the call (an argument value): the text from it to the end of the
    turn locates the same place in the rendering that continues with the tool result, even where
    the template rewrites the turn once it is no longer the last (Qwen3 drops its ``<think>``).
    With ``appended`` (the answer turn has no closer of its own) the closer is the first token
    that only the continued rendering has: the opener of the tool result.
    """
    specials = special_strings(tokenizer)
    try:
        last = render(prompt + [call_turn], tools, False)
        more = render(prompt + [call_turn, result], tools, False)
    except Exception:
        return None
    final_run, start = _run_before_end(last, specials)
    at = last.rfind(marker, 0, start)
    if not final_run or at < 0:
        return None
    anchor = last[at:start]
    found = more.find(anchor)
    next_run = _run_after(more, found + len(anchor), specials) if found >= 0 else []
    if appended:
        shared = _common_prefix(final_run, next_run)
        return next_run[len(shared)] if len(next_run) > len(shared) else None
    return closing_token(final_run, next_run, stop_strings(tokenizer))[0]


def inline_reasoning(reasoning: str, content: str) -> str:
    """Reasoning as the ``<think>`` block thinking models write before their answer."""
    return f"<think>\n{reasoning}\n</think>\n\n{content}"
