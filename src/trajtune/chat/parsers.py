"""Tool-call parsers: model text -> (content, tool calls, errors).

Model output is data: parsers never raise on it and never evaluate it. Every problem becomes an
entry in ``errors`` (counted as a format error by evaluation and usable as a negative signal by
RL), and whatever could be recovered is still returned.

They also stay cheap on adversarial text (a model can emit a megabyte of brackets): every parser
is linear in the length of its input, JSON nested too deep for Python is an error rather than a
RecursionError, and calls whose arguments nest deeper than ``MAX_VALUE_DEPTH`` are dropped with
an error (nothing downstream — stores, checkers, templates — has to cope with them).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trajtune.formats._base import literal_node_to_json, python_literal_to_json
from trajtune.schema import MAX_VALUE_DEPTH, ToolCall, depth_exceeds, fill_call_id


@dataclass
class ParseResult:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reasoning: str | None = None

    @property
    def ok(self) -> bool:
        return not self.errors


Parser = Callable[[str], ParseResult]
_PARSERS: dict[str, Parser] = {}


def register_parser(name: str) -> Callable[[Parser], Parser]:
    def deco(fn: Parser) -> Parser:
        _PARSERS[name] = fn
        return fn

    return deco


def available_parsers() -> list[str]:
    return sorted(_PARSERS)


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


def _json_error(e: Exception) -> str:
    """What went wrong decoding JSON, for an error message (RecursionError: too deep for Python)."""
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} at column {e.colno}"
    return "nested too deep"


def _call_from_obj(obj: Any, raw: str, errors: list[str], where: str) -> ToolCall | None:
    """Build a ToolCall from a decoded ``{"name", "arguments"}`` object, reporting what is off."""
    if not isinstance(obj, dict):
        errors.append(f"{where}: expected a JSON object, got {type(obj).__name__}")
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        errors.append(f"{where}: missing or non-string 'name'")
        return None
    args: Any = obj.get("arguments", obj.get("parameters", {}))
    if args is None:
        args = {}
    if isinstance(args, str):
        # The OpenAI string form inside a Hermes block: double-encoded. Recover, but report it.
        try:
            decoded = json.loads(args)
        except (json.JSONDecodeError, RecursionError):
            errors.append(f"{where}: 'arguments' is a string that is not JSON")
            return ToolCall(id="", name=name, arguments=None, arguments_raw=args)
        errors.append(f"{where}: 'arguments' is double-encoded (a JSON string holding JSON)")
        args = decoded
    if not isinstance(args, dict):
        errors.append(f"{where}: 'arguments' must be a JSON object, got {type(args).__name__}")
        return ToolCall(id="", name=name, arguments=None, arguments_raw=json.dumps(args, ensure_ascii=False))
    call_id = obj.get("id") if isinstance(obj.get("id"), str) and obj.get("id") else ""
    return ToolCall(id=call_id, name=name, arguments=args, arguments_raw=raw)


_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"


def _hermes_object(raw: str, errors: list[str], where: str) -> Any:
    """JSON inside a ``<tool_call>`` block; failing that, a Python literal (``{'name': 'f', ...}``,
    which some models write), read by ``ast`` rules and reported as a format error. None if neither."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as e:
        why = _json_error(e)
    try:
        obj = python_literal_to_json(raw)
    except ValueError:
        errors.append(f"{where}: invalid JSON ({why})")
        return None
    errors.append(f"{where}: not strict JSON but a Python literal (e.g. single quotes); parsed with ast.literal_eval rules")
    return obj


@register_parser("hermes")
def parse_hermes(text: str) -> ParseResult:
    """Hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks."""
    errors: list[str] = []
    calls: list[ToolCall] = []
    content_parts: list[str] = []
    pos = 0
    index = 0
    while True:
        start = text.find(_HERMES_OPEN, pos)
        if start < 0:
            content_parts.append(text[pos:])
            break
        content_parts.append(text[pos:start])
        body_start = start + len(_HERMES_OPEN)
        end = text.find(_HERMES_CLOSE, body_start)
        where = f"tool call {index}"
        if end < 0:
            body = text[body_start:]
            errors.append(f"{where}: unterminated {_HERMES_OPEN}")
            pos = len(text)
        else:
            body = text[body_start:end]
            pos = end + len(_HERMES_CLOSE)
        raw = body.strip()
        if not raw:
            errors.append(f"{where}: empty tool call")
        else:
            obj = _hermes_object(raw, errors, where)
            call = _call_from_obj(obj, raw, errors, where) if obj is not None else None
            if call is not None:
                calls.append(call)
        index += 1
        if end < 0:
            break
    content = "".join(content_parts)
    if _HERMES_CLOSE in content:
        errors.append(f"stray {_HERMES_CLOSE} without an opening tag")
    content = re.sub(r"\n{3,}", "\n\n", content).strip()
    return ParseResult(content=content, tool_calls=calls, errors=errors)


def _tidy(content: str) -> str:
    return re.sub(r"\n{3,}", "\n\n", content).strip()


_DECODER = json.JSONDecoder()


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


# -- Mistral ----------------------------------------------------------------------------------

_MISTRAL_TAG = "[TOOL_CALLS]"
_MISTRAL_ARGS = "[ARGS]"


@register_parser("mistral")
def parse_mistral(text: str) -> ParseResult:
    """Mistral: ``[TOOL_CALLS][{"name": …, "arguments": {…}, "id": "abc123XYZ"}, …]`` (v3), also the
    newer ``[TOOL_CALLS]name[ARGS]{…}`` form. Text before the first tag is content."""
    errors: list[str] = []
    calls: list[ToolCall] = []
    first = text.find(_MISTRAL_TAG)
    if first < 0:
        return ParseResult(content=_tidy(text))
    content = text[:first]
    pos = first
    index = 0
    while pos < len(text):
        if not text.startswith(_MISTRAL_TAG, pos):
            rest = text[pos:]
            if rest.strip():
                errors.append(f"text after the tool calls: {rest.strip()[:60]!r}")
            break
        pos = _skip_ws(text, pos + len(_MISTRAL_TAG))
        if pos >= len(text):
            errors.append(f"tool call {index}: empty {_MISTRAL_TAG}")
            break
        if text[pos] in "[{":
            try:
                obj, end = _DECODER.raw_decode(text, pos)
            except (json.JSONDecodeError, RecursionError) as e:
                errors.append(f"tool call {index}: invalid JSON after {_MISTRAL_TAG} ({_json_error(e)})")
                break
            raw_all = text[pos:end]
            items = obj if isinstance(obj, list) else [obj]
            if not items:
                errors.append(f"tool call {index}: empty call list")
            for item in items:
                raw = json.dumps(item, ensure_ascii=False)
                call = _call_from_obj(item, raw if isinstance(obj, list) else raw_all, errors, f"tool call {index}")
                if call is not None:
                    calls.append(call)
                index += 1
            pos = _skip_ws(text, end)
        else:  # name[ARGS]{...}
            a = text.find(_MISTRAL_ARGS, pos)
            if a < 0:
                errors.append(f"tool call {index}: expected JSON or name{_MISTRAL_ARGS}{{…}} after {_MISTRAL_TAG}")
                break
            name = text[pos:a].strip()
            apos = _skip_ws(text, a + len(_MISTRAL_ARGS))
            try:
                args, end = _DECODER.raw_decode(text, apos)
            except (json.JSONDecodeError, RecursionError) as e:
                errors.append(f"tool call {index}: invalid JSON arguments ({_json_error(e)})")
                break
            call = _call_from_obj({"name": name, "arguments": args}, text[apos:end], errors, f"tool call {index}")
            if call is not None:
                calls.append(call)
            index += 1
            pos = _skip_ws(text, end)
    return ParseResult(content=_tidy(content), tool_calls=calls, errors=errors)


# -- Llama 3 JSON -----------------------------------------------------------------------------

_LLAMA_START = re.compile(r'\{\s*"name"\s*:')
_PYTHON_TAG = "<|python_tag|>"


@register_parser("llama3_json")
def parse_llama3_json(text: str) -> ParseResult:
    """Llama 3.x custom tools: ``{"name": …, "parameters": {…}}`` (``arguments`` accepted too),
    optionally after ``<|python_tag|>``; several calls may be separated by ``;`` or newlines.
    Text before the first call object is content."""
    errors: list[str] = []
    calls: list[ToolCall] = []
    body = text.replace(_PYTHON_TAG, "")
    m = _LLAMA_START.search(body)
    if m is None:
        return ParseResult(content=_tidy(body))
    content = body[:m.start()]
    pos = m.start()
    index = 0
    while pos < len(body):
        pos = _skip_ws(body, pos)
        if pos >= len(body):
            break
        if body[pos] != "{":
            errors.append(f"text after the tool calls: {body[pos:].strip()[:60]!r}")
            break
        try:
            obj, end = _DECODER.raw_decode(body, pos)
        except (json.JSONDecodeError, RecursionError) as e:
            errors.append(f"tool call {index}: invalid JSON ({_json_error(e)})")
            break
        call = _call_from_obj(obj, body[pos:end], errors, f"tool call {index}")
        if call is not None:
            calls.append(call)
        index += 1
        pos = _skip_ws(body, end)
        if pos < len(body) and body[pos] in ";,":
            pos += 1
    return ParseResult(content=_tidy(content), tool_calls=calls, errors=errors)


# -- pythonic ---------------------------------------------------------------------------------

_PY_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_FENCE = re.compile(r"```(?:tool_code|python|py)?[ \t]*\n?|```")


def _literal(node: ast.AST) -> Any:
    """A literal value from an AST node; JSON spellings true/false/null accepted. Never evaluates.

    Lists, tuples and dicts are walked here (tuples stay tuples); every leaf goes through
    ``literal_node_to_json``, so values JSON cannot store (sets, bytes, complex) are refused."""
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("** unpacking in a dict")
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}  # type: ignore[arg-type]
    return literal_node_to_json(node)


_PY_MAX_NESTING = 200
_PY_SCAN = re.compile(r"""['"#()\[\]{}]""")
_PY_STR_END = {q: re.compile(r"\\|\n|" + re.escape(q)) for q in ("'", '"')}
_PY_STR_END.update({q * 3: re.compile(r"\\|" + re.escape(q * 3)) for q in ("'", '"')})


def _string_end(text: str, pos: int, quote: str) -> int:
    """Index just past the Python string literal whose opening ``quote`` ends at ``pos``; -1 if unterminated."""
    pattern = _PY_STR_END[quote]
    while True:
        m = pattern.search(text, pos)
        if m is None or m.group() == "\n":
            return -1
        if m.group() == "\\":
            pos = m.end() + 1  # skip the escaped character (a quote, a newline, a backslash)
            continue
        return m.end()


def _closing_bracket(text: str, start: int) -> int:
    """Index of the ``]`` that closes the ``[`` at ``start``, skipping strings and comments; -1 when
    the list is unterminated or its brackets do not match. One left-to-right pass: linear time
    (trying ``ast.parse`` at every ``]`` instead is quadratic on ``[f(a=' + ']' * n``)."""
    stack: list[str] = []
    pos = start
    while True:
        m = _PY_SCAN.search(text, pos)
        if m is None:
            return -1
        ch, pos = m.group(), m.end()
        if ch in "([{":
            stack.append({"(": ")", "[": "]", "{": "}"}[ch])
            if len(stack) > _PY_MAX_NESTING:  # Python's own parser refuses this much nesting
                return -1
        elif ch in ")]}":
            if not stack or stack.pop() != ch:
                return -1
            if not stack:
                return m.start()
        elif ch == "#":
            nl = text.find("\n", pos)
            if nl < 0:
                return -1
            pos = nl
        else:
            quote = ch * 3 if text.startswith(ch * 3, m.start()) else ch
            pos = _string_end(text, m.start() + len(quote), quote)
            if pos < 0:
                return -1


class _Segments:
    """``ast.get_source_segment`` for many nodes of one source in linear total time (the stdlib
    version re-splits the whole source for every node: quadratic for a list of many calls)."""

    def __init__(self, source: str):
        self.data = source.encode("utf-8", "surrogatepass")
        self.starts = [0] + [m.end() for m in re.finditer(rb"\r\n|\r|\n", self.data)]

    def get(self, node: ast.AST) -> str | None:
        try:
            a = self.starts[node.lineno - 1] + node.col_offset  # type: ignore[attr-defined]
            b = self.starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]
        except (AttributeError, IndexError, TypeError):
            return None
        return self.data[a:b].decode("utf-8", "replace")


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


@register_parser("pythonic")
def parse_pythonic(text: str) -> ParseResult:
    """Pythonic calls (Llama 3.2/4, Gemma ``tool_code``): ``[f(a=1), g(b="x")]``.

    The list is parsed with ``ast`` and each keyword value read from its node by literal rules
    (what ``ast.literal_eval`` accepts and JSON can store): nothing is ever evaluated, so
    ``[f(a=__import__('os'))]`` is a parse error, not a call.
    """
    errors: list[str] = []
    calls: list[ToolCall] = []
    m = _PY_START.search(text)
    if m is None:
        return ParseResult(content=_tidy(_FENCE.sub("", text)))
    start = m.start()
    end = _closing_bracket(text, start)
    tree: ast.Expression | None = None
    if end >= 0:
        try:
            tree = ast.parse(text[start:end + 1], mode="eval")
        except (SyntaxError, ValueError, MemoryError, RecursionError):  # MemoryError: "too complex to parse"
            tree = None
    if tree is None:
        errors.append("unterminated or invalid call list")
        return ParseResult(content=_tidy(_FENCE.sub("", text[:start])), errors=errors)
    rest = _FENCE.sub("", text[end + 1:])
    content = _FENCE.sub("", text[:start]) + rest
    if not isinstance(tree.body, ast.List):
        errors.append("expected a list of calls")
        return ParseResult(content=_tidy(content), errors=errors)
    if not tree.body.elts:
        errors.append("empty call list")
    segments = _Segments(text[start:end + 1])
    for i, node in enumerate(tree.body.elts):
        where = f"tool call {i}"
        if not isinstance(node, ast.Call) or _dotted(node.func) is None:
            errors.append(f"{where}: not a function call")
            continue
        name = _dotted(node.func) or ""
        raw = segments.get(node) or name
        if node.args:
            errors.append(f"{where}: positional arguments are not allowed (use name=value)")
            continue
        args: dict[str, Any] = {}
        ok = True
        for kw in node.keywords:
            if kw.arg is None:
                errors.append(f"{where}: ** arguments are not allowed")
                ok = False
                break
            try:
                args[kw.arg] = _literal(kw.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                errors.append(f"{where}: argument {kw.arg!r} is not a literal value")
                ok = False
                break
        if ok:
            calls.append(ToolCall(id="", name=name, arguments=args, arguments_raw=raw))
    return ParseResult(content=_tidy(content), tool_calls=calls, errors=errors)


# -- ReAct ------------------------------------------------------------------------------------

_ACTION = re.compile(r"^[ \t]*Action[ \t]*:[ \t]*(.*)$", re.MULTILINE)
_ACTION_INPUT = re.compile(r"^[ \t]*Action[ \t]+Input[ \t]*:[ \t]*", re.MULTILINE)
_OBSERVATION = re.compile(r"^[ \t]*Observation[ \t]*:", re.MULTILINE)
_FINAL = re.compile(r"^[ \t]*Final[ \t]+Answer[ \t]*:[ \t]*", re.MULTILINE)


def _react_args(raw: str, where: str, errors: list[str]) -> dict[str, Any] | None:
    """A JSON object stays a dict; any other text is the single ``input`` argument (the classic
    ReAct convention); empty input is an empty call."""
    raw = raw.strip()
    if not raw:
        return {}
    if raw.startswith("{"):
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, RecursionError) as e:
            errors.append(f"{where}: action input looks like JSON but is invalid ({_json_error(e)})")
            return None
        if isinstance(obj, dict):
            return obj
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        raw = raw[1:-1]
    return {"input": raw}


@register_parser("react")
def parse_react(text: str) -> ParseResult:
    """ReAct text: ``Thought: …`` then ``Action: name[args]`` or ``Action: name`` + ``Action Input:
    args``. ``Final Answer: x`` is content. Text the model invents after its action (a fake
    ``Observation:``) is cut off and reported."""
    errors: list[str] = []
    calls: list[ToolCall] = []
    body = text
    obs = _OBSERVATION.search(body)
    first_action = _ACTION.search(body)
    if obs is not None and first_action is not None and obs.start() > first_action.start():
        errors.append("text after the action (the model wrote its own Observation)")
        body = body[:obs.start()]
    actions = list(_ACTION.finditer(body))
    if not actions:
        fin = _FINAL.search(body)
        content = body[fin.end():] if fin else body
        return ParseResult(content=_tidy(content), errors=errors)
    content = body[:actions[0].start()]
    for i, m in enumerate(actions):
        where = f"tool call {i}"
        seg_end = actions[i + 1].start() if i + 1 < len(actions) else len(body)
        head = m.group(1).strip()
        segment = body[m.end():seg_end]
        bracket = head.find("[")
        if bracket > 0:
            name = head[:bracket].strip()
            close = head.rfind("]")
            if close < bracket:
                errors.append(f"{where}: unterminated {name}[…]")
                continue
            raw = head[bracket + 1:close]
            if head[close + 1:].strip():
                errors.append(f"{where}: text after {name}[…] on the action line")
        else:
            name = head
            ai = _ACTION_INPUT.search(segment)
            raw = segment[ai.end():] if ai else ""
        if not re.fullmatch(r"[A-Za-z_][\w.\-]*", name or ""):
            errors.append(f"{where}: invalid tool name {name!r}")
            continue
        args = _react_args(raw, where, errors)
        if args is None:  # reported; a call with unreadable arguments is not executed
            continue
        calls.append(ToolCall(id="", name=name, arguments=args, arguments_raw=raw.strip() or None))
    return ParseResult(content=_tidy(content), tool_calls=calls, errors=errors)


# -- DeepSeek ---------------------------------------------------------------------------------

_DS_CALLS_BEGIN, _DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_DS_CALL_BEGIN, _DS_CALL_END, _DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def _ds_call(piece: str) -> tuple[str, str] | None:
    """``(name, raw arguments)`` of one DeepSeek call: ``function<sep>name\n```json\n{…}\n`````.

    Plain string operations rather than one regex: a lazy regex over this shape backtracks
    quadratically (or worse) on long runs of whitespace, which a model can emit."""
    head, sep, rest = piece.partition(_DS_SEP)
    if not sep or head.strip() not in ("", "function"):
        return None
    name, nl, body = rest.lstrip().partition("\n")
    name, body = name.strip(), body.strip()
    if not nl or not name or not body.startswith("```") or len(body) < 6 or not body.endswith("```"):
        return None
    inner = body[3:-3]
    if inner.startswith("json"):
        inner = inner[4:]
    return name, inner.strip()


@register_parser("deepseek")
def parse_deepseek(text: str) -> ParseResult:
    """DeepSeek V3/R1: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name
    ```json {…} ```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>``."""
    errors: list[str] = []
    calls: list[ToolCall] = []
    start = text.find(_DS_CALLS_BEGIN)
    if start < 0:
        return ParseResult(content=_tidy(text))
    content = text[:start]
    end = text.find(_DS_CALLS_END, start)
    if end < 0:
        errors.append(f"unterminated {_DS_CALLS_BEGIN}")
        block = text[start + len(_DS_CALLS_BEGIN):]
    else:
        block = text[start + len(_DS_CALLS_BEGIN):end]
        rest = text[end + len(_DS_CALLS_END):]
        if rest.strip():
            errors.append(f"text after the tool calls: {rest.strip()[:60]!r}")
    pieces = block.split(_DS_CALL_BEGIN)
    if pieces[0].strip():
        errors.append("text inside the call block outside any call")
    if len(pieces) == 1:
        errors.append("empty call block")
    for i, piece in enumerate(pieces[1:]):
        where = f"tool call {i}"
        if _DS_CALL_END in piece:
            piece = piece[:piece.index(_DS_CALL_END)]
        else:
            errors.append(f"{where}: unterminated {_DS_CALL_BEGIN}")
        parts = _ds_call(piece)
        if parts is None:
            errors.append(f"{where}: expected function{_DS_SEP}name followed by a ```json block")
            continue
        name, raw = parts
        try:
            args = json.loads(raw) if raw else {}
        except (json.JSONDecodeError, RecursionError) as e:
            errors.append(f"{where}: invalid JSON arguments ({_json_error(e)})")
            continue
        call = _call_from_obj({"name": name, "arguments": args}, raw, errors, where)
        if call is not None:
            calls.append(call)
    return ParseResult(content=_tidy(content), tool_calls=calls, errors=errors)


# -- detection --------------------------------------------------------------------------------

def detect_parser(chat_template: str | None) -> str | None:
    """The parser matching the call format a chat template renders, or None if it renders none.

    Checks the template source for each format's markers, most specific first (Qwen templates
    mention ``<tool_call>``; Llama 3.1 templates ``"parameters"``; Gemma-style ``tool_code``).
    """
    t = chat_template or ""
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
