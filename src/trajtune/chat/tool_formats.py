"""Tool formats for chat templates that cannot render tools (or tool calls) themselves.

Why: many instruct models (SmolLM2, Gemma 1/2, Phi-3, most base models) ship a template with no
tool support: passed ``tools=…`` and ``tool_calls``, it silently drops them. To teach such a model
to call tools, trajtune writes the tool schemas into the system turn, the calls into the assistant
text and the results into a turn the template accepts, in one of the common text conventions, and
reads the model's output back with the matching parser. Training, rollouts and evaluation all go
through this one module, so what the model is trained on is exactly what it sees and writes later.

Each format is a small object: how the tool list is introduced, how a call is written, how a
result is wrapped, and which registered parser reads the calls back.

Some templates have a native call format and still cannot render ``tool_calls``: LFM2's lists the
tools itself (``<|tool_list_start|>…``) and wraps tool results, but reads a call only from the
assistant content, where the model writes it as text. A format with ``native_tool_list`` writes
just the calls, in that family's own syntax, and leaves the tool list and the results to the
template (``tool_format: auto`` picks it where the template's source shows that family).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trajtune.schema import ToolCall, ToolSpec


def _call_args(call: ToolCall) -> Any:
    """The arguments as the model should write them: the parsed object, else the raw text it wrote."""
    if call.arguments is not None:
        return call.arguments
    if call.arguments_raw is not None:
        try:
            decoded = json.loads(call.arguments_raw)
        except json.JSONDecodeError:
            return call.arguments_raw
        return decoded
    return {}


def _tools_json(tools: list[ToolSpec]) -> list[str]:
    return [json.dumps(t.to_openai(), ensure_ascii=False) for t in tools]


@dataclass(frozen=True)
class ToolFormat:
    """One text convention for tools. ``parser`` is the registered parser that reads its calls."""

    name: str
    parser: str
    #: the template lists the tools and wraps the results itself: only the calls are written as text
    native_tool_list: bool = False

    def system_text(self, tools: list[ToolSpec]) -> str:
        raise NotImplementedError

    def call_text(self, calls: list[ToolCall]) -> str:
        raise NotImplementedError

    def result_text(self, content: str) -> str:
        return content

    def assistant_text(self, content: str, calls: list[ToolCall]) -> str:
        """Content followed by the calls, separated by one newline when both are present."""
        if not calls:
            return content
        calls_text = self.call_text(calls)
        return f"{content}\n{calls_text}" if content else calls_text


class HermesFormat(ToolFormat):
    """Hermes / Qwen 2.5: schemas in ``<tools>``, calls as ``<tool_call>{json}</tool_call>``, results in
    ``<tool_response>``. The most widely pre-trained convention among small open models."""

    def system_text(self, tools: list[ToolSpec]) -> str:
        return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
                + "\n".join(_tools_json(tools)) + "\n</tools>\n\n"
                "For each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')

    def call_text(self, calls: list[ToolCall]) -> str:
        return "\n".join("<tool_call>\n" + json.dumps({"name": c.name, "arguments": _call_args(c)}, ensure_ascii=False)
                         + "\n</tool_call>" for c in calls)

    def result_text(self, content: str) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"


class Llama3JsonFormat(ToolFormat):
    """Llama 3.1 custom tools: the model answers with ``{"name": …, "parameters": {…}}``."""

    def system_text(self, tools: list[ToolSpec]) -> str:
        return ("Given the following functions, please respond with a JSON for a function call with its proper "
                "arguments that best answers the given prompt.\n\nRespond in the format "
                '{"name": function name, "parameters": dictionary of argument name and its value}. '
                "Do not use variables.\n\n" + "\n\n".join(_tools_json(tools)))

    def call_text(self, calls: list[ToolCall]) -> str:
        return "; ".join(json.dumps({"name": c.name, "parameters": _call_args(c)}, ensure_ascii=False) for c in calls)


def _py(value: Any, string: Any = repr) -> str:
    """A Python literal that ``ast.literal_eval`` reads back as ``value`` (JSON types only);
    ``string`` writes the strings."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(k, string)}: {_py(v, string)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_py(v, string) for v in value) + "]"
    return string(value) if isinstance(value, str) else repr(value)


class PythonicFormat(ToolFormat):
    """Pythonic calls (Llama 3.2, Gemma ``tool_code``): ``[func(a=1, b='x')]``."""

    def system_text(self, tools: list[ToolSpec]) -> str:
        return ("You can call functions. To call them, answer with a Python list of calls and nothing else, e.g. "
                "[func_name1(param_a=value, param_b=value), func_name2(param=value)]\n\n"
                "Available functions (JSON schema):\n" + "\n".join(_tools_json(tools)))

    def string(self, s: str) -> str:
        """How a string argument is written (``'x'``)."""
        return repr(s)

    def call_text(self, calls: list[ToolCall]) -> str:
        parts = []
        for c in calls:
            args = _call_args(c)
            kw = ", ".join(f"{k}={_py(v, self.string)}" for k, v in args.items()) if isinstance(args, dict) else ""
            parts.append(f"{c.name}({kw})")
        return "[" + ", ".join(parts) + "]"


class Lfm2Format(PythonicFormat):
    """LFM2 (Liquid): the template lists the tools between ``<|tool_list_start|>`` and
    ``<|tool_list_end|>`` and wraps results in ``<|tool_response_start|>…``, but never reads
    ``tool_calls``. The model writes its calls first, as a pythonic list with double-quoted strings
    between ``<|tool_call_start|>`` and ``<|tool_call_end|>``, then any text:
    ``<|tool_call_start|>[get_weather(city="Zürich")]<|tool_call_end|>Checking.``"""

    def system_text(self, tools: list[ToolSpec]) -> str:
        return ""  # (the template writes the tool list)

    def string(self, s: str) -> str:
        """``"x"`` as JSON writes it: a Python literal too (every JSON escape means the same there)."""
        return json.dumps(s, ensure_ascii=False)

    def call_text(self, calls: list[ToolCall]) -> str:
        return "<|tool_call_start|>" + super().call_text(calls) + "<|tool_call_end|>"

    def assistant_text(self, content: str, calls: list[ToolCall]) -> str:
        return self.call_text(calls) + content if calls else content


TOOL_FORMATS: dict[str, ToolFormat] = {
    "hermes": HermesFormat("hermes", "hermes"),
    "llama3_json": Llama3JsonFormat("llama3_json", "llama3_json"),
    "pythonic": PythonicFormat("pythonic", "pythonic"),
    "lfm2": Lfm2Format("lfm2", "lfm2", native_tool_list=True),
}

#: What ``tool_format: auto`` tries, in order, when the template cannot render tools natively.
FALLBACK_ORDER = ("hermes", "llama3_json", "pythonic")
