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
from trajtune.schema import MAX_VALUE_DEPTH, Message, ToolCall, depth_exceeds, fill_call_id


@dataclass
class ParseResult:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reasoning: str | None = None

    @property
    def ok(self) -> bool:
        return not self.errors


def assistant_message(content: str, tool_calls: list[ToolCall] | None, errors: list[str], raw: str) -> Message:
    """The assistant turn the model wrote, as parsed. Where parsing failed, the raw text is kept
    (``extra.raw_text``, beside ``extra.parse_errors``): a call that did not parse is dropped from
    the content, and without it a format error could be counted but never read."""
    extra: dict[str, Any] = {"parse_errors": errors, "raw_text": raw} if errors else {}
    return Message(role="assistant", content=content or None, tool_calls=tool_calls or None, origin="agent",
                   extra=extra)


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


# -- shared by the XML-ish formats ------------------------------------------------------------

def _scalar_or_text(raw: str) -> Any:
    """A parameter value from a template that writes strings raw and everything else as JSON.

    A value that decodes as JSON to something other than a string (number, boolean, null,
    object, array) is decoded; anything else stays the text itself. Without the tool's schema
    this is ambiguous: a string parameter whose text is ``42`` or ``true`` comes back as a number
    or a boolean. (Qwen3-Coder's template writes booleans with Python's ``str``, ``True``: that
    stays the string "True".)
    """
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return raw
    except RecursionError:  # JSON nested beyond what Python decodes: certainly not a plain string
        raise _TooDeep from None
    return raw if isinstance(value, str) else value


class _TooDeep(ValueError):
    """A value nested too deep to decode (reported by the caller as a format error)."""


def _between(text: str, start: int, close: str) -> tuple[str, int, bool]:
    """(text up to ``close``, position after it, whether it was found); unfound: the rest."""
    end = text.find(close, start)
    if end < 0:
        return text[start:], len(text), False
    return text[start:end], end + len(close), True


# -- XML (Qwen3-Coder, Qwen3.5) ---------------------------------------------------------------

_XML_FUNCTION = "<function="
_XML_PARAM = re.compile(r"<parameter=([^>\n]*)>")


def _xml_params(body: str, where: str, errors: list[str]) -> dict[str, Any] | None:
    args: dict[str, Any] = {}
    pos = 0
    while True:
        m = _XML_PARAM.search(body, pos)
        stray = body[pos:m.start() if m else len(body)].strip()
        if stray:
            errors.append(f"{where}: text outside <parameter=…>: {stray[:60]!r}")
            return None
        if m is None:
            return args
        raw, pos, closed = _between(body, m.end(), "</parameter>")
        name = m.group(1).strip()
        if not closed:
            errors.append(f"{where}: unterminated <parameter={name}>")
            return None
        if not name or name in args:
            errors.append(f"{where}: {'duplicate' if name else 'empty'} parameter name {name!r}")
            return None
        raw = raw[1:] if raw.startswith("\n") else raw  # the template writes "\n" + value + "\n"
        try:
            args[name] = _scalar_or_text(raw[:-1] if raw.endswith("\n") else raw)
        except _TooDeep:
            errors.append(f"{where}: parameter {name!r} is nested deeper than {MAX_VALUE_DEPTH} levels")
            return None


@register_parser("xml")
def parse_xml(text: str) -> ParseResult:
    """Qwen3-Coder / Qwen3.5: ``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>
    \\n</function>\\n</tool_call>``, one block per call, the outer ``<tool_call>`` optional. Values
    follow :func:`_scalar_or_text`. Text outside the blocks is content."""
    errors: list[str] = []
    calls: list[ToolCall] = []
    content: list[str] = []
    pos = 0
    index = 0
    while (start := text.find(_XML_FUNCTION, pos)) >= 0:
        where = f"tool call {index}"
        index += 1
        before = text[pos:start]
        wrapped = before.rstrip().endswith(_HERMES_OPEN)
        content.append(before.rstrip()[: -len(_HERMES_OPEN)] if wrapped else before)
        head_end = text.find(">", start)
        name = text[start + len(_XML_FUNCTION):head_end].strip() if head_end >= 0 else ""
        if head_end < 0 or not name or "\n" in name:
            errors.append(f"{where}: unterminated or empty <function=…> tag")
            return ParseResult(content=_tidy("".join(content)), tool_calls=calls, errors=errors)
        body, pos, closed = _between(text, head_end + 1, "</function>")
        if not closed:
            errors.append(f"{where}: unterminated <function={name}>")
        elif wrapped:
            rest = _skip_ws(text, pos)
            closed = text.startswith(_HERMES_CLOSE, rest)
            if closed:
                pos = rest + len(_HERMES_CLOSE)
            else:
                errors.append(f"{where}: unterminated {_HERMES_OPEN}")
        args = _xml_params(body, where, errors)
        if args is not None and closed:  # a cut-off call may lack parameters: reported, not executed
            calls.append(ToolCall(id="", name=name, arguments=args, arguments_raw=body.strip()))
    rest = text[pos:]
    content.append(rest)
    for tag in (_HERMES_OPEN, _HERMES_CLOSE):
        if tag in rest:
            errors.append(f"stray {tag} without a <function=…> block")
    return ParseResult(content=_tidy("".join(content)), tool_calls=calls, errors=errors)


# -- GLM-4.5 ----------------------------------------------------------------------------------

_GLM_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


@register_parser("glm45")
def parse_glm45(text: str) -> ParseResult:
    """GLM-4.5/4.6: ``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n…
    </tool_call>`` per call; values follow :func:`_scalar_or_text`. Text outside is content."""
    errors: list[str] = []
    calls: list[ToolCall] = []
    content: list[str] = []
    pos = 0
    index = 0
    while (start := text.find(_HERMES_OPEN, pos)) >= 0:
        where = f"tool call {index}"
        index += 1
        content.append(text[pos:start])
        body, pos, closed = _between(text, start + len(_HERMES_OPEN), _HERMES_CLOSE)
        if not closed:
            errors.append(f"{where}: unterminated {_HERMES_OPEN}")
        cut = min((i for i in (body.find("<arg_key>"), body.find("\n")) if i >= 0), default=len(body))
        name, rest = body[:cut].strip(), body[cut:]
        if not re.fullmatch(r"[^\s<>{}\[\]\"]+", name):
            errors.append(f"{where}: expected a function name after {_HERMES_OPEN}, got {name[:40]!r}")
            continue
        args: dict[str, Any] = {}
        at = 0
        deep = False
        while (m := _GLM_PAIR.match(rest, at)) is not None and m.group(1).strip() not in args:
            try:
                args[m.group(1).strip()] = _scalar_or_text(m.group(2))
            except _TooDeep:
                errors.append(f"{where}: argument {m.group(1).strip()!r} is nested deeper than {MAX_VALUE_DEPTH} levels")
                deep = True
                break
            at = m.end()
        if deep:
            continue
        if rest[at:].strip():  # also a repeated key: the pair is left unread
            errors.append(f"{where}: expected <arg_key>K</arg_key><arg_value>V</arg_value> pairs, "
                          f"got {rest[at:].strip()[:60]!r}")
            continue
        if closed:  # a cut-off call may lack arguments: reported, not executed
            calls.append(ToolCall(id="", name=name, arguments=args, arguments_raw=rest.strip()))
    content.append(text[pos:])
    return ParseResult(content=_tidy("".join(content)), tool_calls=calls, errors=errors)


# -- tagged JSON lists (Nemotron, Cohere) -----------------------------------------------------

def _json_calls(raw: str, where: str, errors: list[str], name_key: str = "name",
                args_key: str = "arguments", id_key: str = "id") -> list[ToolCall]:
    """Calls from a JSON list of objects (one object is accepted, and reported)."""
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as e:
        errors.append(f"{where}: invalid JSON ({getattr(e, 'msg', type(e).__name__)})")
        return []
    if isinstance(obj, dict):
        errors.append(f"{where}: expected a JSON list of calls, got one object")
        obj = [obj]
    if not isinstance(obj, list) or not obj:
        errors.append(f"{where}: expected a non-empty JSON list of calls")
        return []
    calls: list[ToolCall] = []
    for k, item in enumerate(obj):
        if isinstance(item, dict):
            cid = item.get(id_key)
            item = {"name": item.get(name_key), "arguments": item.get(args_key, {}),
                    "id": str(cid) if isinstance(cid, (str, int)) and not isinstance(cid, bool) else ""}
        call = _call_from_obj(item, json.dumps(item, ensure_ascii=False), errors, f"{where}.{k}")
        if call is not None:
            calls.append(call)
    return calls


_TOOLCALL_OPEN, _TOOLCALL_CLOSE = "<TOOLCALL>", "</TOOLCALL>"


@register_parser("nemotron")
def parse_nemotron(text: str) -> ParseResult:
    """Llama-Nemotron: content, then ``<TOOLCALL>[{"name": …, "arguments": {…}}, …]</TOOLCALL>``."""
    errors: list[str] = []
    start = text.find(_TOOLCALL_OPEN)
    if start < 0:
        return ParseResult(content=_tidy(text))
    raw, end, closed = _between(text, start + len(_TOOLCALL_OPEN), _TOOLCALL_CLOSE)
    if not closed:
        errors.append(f"unterminated {_TOOLCALL_OPEN}")
    elif text[end:].strip():
        errors.append(f"text after {_TOOLCALL_CLOSE}: {text[end:].strip()[:60]!r}")
    calls = _json_calls(raw.strip(), "tool call", errors) if closed else []
    return ParseResult(content=_tidy(text[:start]), tool_calls=calls, errors=errors)


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


# -- LFM2 -------------------------------------------------------------------------------------

_LFM_OPEN, _LFM_CLOSE = "<|tool_call_start|>", "<|tool_call_end|>"


@register_parser("lfm2")
def parse_lfm2(text: str) -> ParseResult:
    """LFM2: ``<|tool_call_start|>[f(a=1), g(b="x")]<|tool_call_end|>`` (pythonic, read by the
    ``pythonic`` parser: nothing is evaluated) or a JSON list of ``{"name", "arguments"}`` in the
    same markers. Text outside the markers is content."""
    errors: list[str] = []
    calls: list[ToolCall] = []
    content: list[str] = []
    pos = 0
    index = 0
    while (start := text.find(_LFM_OPEN, pos)) >= 0:
        where = f"call block {index}"
        index += 1
        content.append(text[pos:start])
        inner, pos, closed = _between(text, start + len(_LFM_OPEN), _LFM_CLOSE)
        if not closed:  # a cut-off call list is reported, never executed
            errors.append(f"{where}: unterminated {_LFM_OPEN}")
            break
        body = inner.strip()
        if body.startswith(("[{", "{")):
            calls += _json_calls(body, where, errors)
            continue
        sub = parse_pythonic(body)
        errors += [f"{where}: {e}" for e in sub.errors]
        if not sub.tool_calls and not sub.errors:
            errors.append(f"{where}: expected a call list like [f(a=1)]")
        elif sub.content:
            errors.append(f"{where}: text inside the call block: {sub.content[:60]!r}")
        calls += sub.tool_calls
    content.append(text[pos:])
    if _LFM_CLOSE in content[-1]:
        errors.append(f"stray {_LFM_CLOSE} without an opening marker")
    return ParseResult(content=_tidy("".join(content)), tool_calls=calls, errors=errors)


# -- GPT-OSS harmony --------------------------------------------------------------------------

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


# -- detection --------------------------------------------------------------------------------

_JINJA_COMMENT = re.compile(r"\{#.*?#\}", re.DOTALL)


def detect_parser(chat_template: str | None) -> str | None:
    """The parser matching the call format a chat template renders, or None if it renders none.

    Checks the template source, Jinja comments removed, for each format's markers, most specific
    first: GLM-4.5 and Qwen3.5 templates also write ``<tool_call>``, Cohere's also
    ``"parameters"``; Llama 3.1 templates ``"parameters"``; Gemma-style ``tool_code``.
    """
    t = _JINJA_COMMENT.sub("", chat_template or "")
    if "<|call|>" in t and _H_CHANNEL in t:
        return "harmony"
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
