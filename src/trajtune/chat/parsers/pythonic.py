"""Pythonic call lists (Llama 3.2/4, Gemma 3 ``tool_code``): ``[f(a=1), g(b="x")]``, read with ``ast``
and literal rules only: nothing is ever evaluated."""

from __future__ import annotations

import ast
import re
from typing import Any

from trajtune.chat.parsers.base import ParseResult, _tidy, register_parser
from trajtune.formats._base import literal_node_to_json
from trajtune.schema import ToolCall

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
