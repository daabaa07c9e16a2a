"""Which parser reads the calls a chat template renders, judged from the template source."""

from __future__ import annotations

import re

from trajtune.chat.parsers.gemma4 import CALL_CLOSE as _GEMMA4_CLOSE
from trajtune.chat.parsers.gemma4 import CALL_OPEN as _GEMMA4_OPEN
from trajtune.chat.parsers.harmony import _H_CHANNEL
from trajtune.chat.parsers.lfm2 import _LFM_OPEN
from trajtune.chat.parsers.nemotron import _TOOLCALL_OPEN
from trajtune.chat.parsers.xml import _XML_FUNCTION
from trajtune.chat.templates import strip_jinja_comments


def detect_parser(chat_template: str | None) -> str | None:
    """The parser matching the call format a chat template renders, or None if it renders none.

    Checks the template source, Jinja comments removed, for each format's markers, most specific
    first: GLM-4.5 and Qwen3.5 templates also write ``<tool_call>``, Cohere's also
    ``"parameters"``; Llama 3.1 templates ``"parameters"``; Gemma 3-style ``tool_code``; Gemma 4
    ``<|tool_call>call:``.
    """
    t = strip_jinja_comments(chat_template or "")
    if "<|call|>" in t and _H_CHANNEL in t:
        return "harmony"
    if _GEMMA4_OPEN in t and _GEMMA4_CLOSE in t:
        return "gemma4"
    if "<|START_ACTION|>" in t:
        return "cohere"
    if _TOOLCALL_OPEN in t:
        return "nemotron"
    if _LFM_OPEN in t or "<|tool_list_start|>" in t:
        return "lfm2"
    if "<arg_key>" in t:
        return "glm45"
    if _XML_FUNCTION in t:
        return "xml"
    if "<tool_call>" in t:
        return "hermes"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "tool▁calls▁begin" in t or "tool_calls_begin" in t:
        return "deepseek"
    if "tool_code" in t or "pythonic" in t.lower():
        return "pythonic"
    if "Action Input" in t or re.search(r"Action:\s*'?\s*\+", t):
        return "react"
    if '"parameters"' in t or "<|python_tag|>" in t or "ipython" in t:
        return "llama3_json"
    return None
