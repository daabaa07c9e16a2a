"""Python functions as tools: JSON Schema from type hints and docstrings, and safe dispatch.

Every tool-calling environment (built-in worlds, ``PythonToolsEnv``) answers tool calls through
``ToolDispatcher`` so that the rules are the same everywhere:

- arguments are checked against the tool's schema before the function runs (missing required,
  unknown names, wrong JSON type): a bad call is the *agent's* mistake, so it becomes an
  ``Error: ...`` observation and the episode continues;
- a tool raising ``ToolError`` (or another exception type the environment declares recoverable)
  is also an observation: "order not found" is information for the agent;
- any other exception, or a return value that is not text / JSON-serialisable, is a bug in the
  environment: it propagates, and the batch runner turns it into ``termination="env_error"``.

Model output is data: arguments arrive already parsed (dicts), and nothing here evaluates text.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union, get_args, get_origin

from trajtune.schema import Message, ToolCall, ToolSpec


class ToolError(Exception):
    """An expected, agent-facing tool failure (bad id, empty search, ...). Becomes an observation."""


class ToolReturnError(TypeError):
    """A tool returned something that cannot be shown to the agent as text (an environment bug)."""


_PRIMITIVES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def annotation_to_schema(ann: Any) -> dict[str, Any]:
    """Map a Python type annotation to a JSON Schema fragment (best effort, never raises)."""
    if ann is inspect.Parameter.empty or ann is Any:
        return {}
    if ann in _PRIMITIVES:
        return {"type": _PRIMITIVES[ann]}
    if ann is type(None):
        return {"type": "null"}
    if ann in (list, tuple):
        return {"type": "array"}
    if ann is dict:
        return {"type": "object"}
    origin = get_origin(ann)
    args = get_args(ann)
    if origin is Literal:
        values = list(args)
        schema: dict[str, Any] = {"enum": values}
        kinds = {type(v) for v in values}
        if len(kinds) == 1 and next(iter(kinds)) in _PRIMITIVES:
            schema["type"] = _PRIMITIVES[next(iter(kinds))]
        return schema
    if origin in (Union, types.UnionType):
        non_null = [a for a in args if a is not type(None)]
        if len(non_null) == 1:
            return annotation_to_schema(non_null[0])
        return {"anyOf": [annotation_to_schema(a) for a in non_null]}
    if origin in (list, tuple, set, frozenset) or origin is typing.Sequence:
        item = annotation_to_schema(args[0]) if args else {}
        return {"type": "array", "items": item} if item else {"type": "array"}
    if origin is dict:
        return {"type": "object"}
    return {}


_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (summary, {param: description})."""
    if not doc:
        return "", {}
    doc = inspect.cleandoc(doc)
    lines = doc.splitlines()
    summary_lines: list[str] = []
    params: dict[str, str] = {}
    i = 0
    while i < len(lines) and lines[i].strip().lower() not in ("args:", "arguments:", "parameters:", "returns:", "raises:"):
        summary_lines.append(lines[i])
        i += 1
    current: str | None = None
    in_args = False
    arg_indent: int | None = None
    for line in lines[i:]:
        head = line.strip().lower()
        if head in ("args:", "arguments:", "parameters:"):
            in_args, current, arg_indent = True, None, None
            continue
        if head.endswith(":") and not line.startswith((" ", "\t")):
            in_args, current = False, None
            continue
        if not in_args or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        m = _ARG_LINE.match(line)
        if m and (arg_indent is None or indent <= arg_indent):
            arg_indent = indent
            current = m.group(1).lstrip("*")
            params[current] = m.group(2).strip()
        elif current:
            params[current] = (params[current] + " " + line.strip()).strip()
    summary = " ".join(s.strip() for s in summary_lines).strip()
    return summary, params


def function_to_toolspec(fn: Callable[..., Any], name: str | None = None) -> ToolSpec:
    """Build a ToolSpec from a function's signature, type hints and docstring.

    Parameters without a default are required; ``self`` and ``*args/**kwargs`` are skipped.
    """
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: fall back to raw annotations
        hints = {}
    summary, arg_docs = parse_docstring(inspect.getdoc(fn))
    props: dict[str, Any] = {}
    required: list[str] = []
    for pname, p in sig.parameters.items():
        if pname == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        schema = annotation_to_schema(hints.get(pname, p.annotation))
        if pname in arg_docs and arg_docs[pname]:
            schema["description"] = arg_docs[pname]
        if p.default is inspect.Parameter.empty:
            required.append(pname)
        else:
            try:
                json.dumps(p.default)
                schema["default"] = p.default
            except TypeError:
                pass
        props[pname] = schema
    params: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        params["required"] = required
    params["additionalProperties"] = False
    return ToolSpec(name=name or fn.__name__, description=summary, parameters=params)


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}


def check_arguments(spec: ToolSpec, args: dict[str, Any]) -> str | None:
    """Return a one-line problem with ``args`` under ``spec``'s schema, or None when they fit."""
    params = spec.parameters or {}
    props: dict[str, Any] = params.get("properties", {}) or {}
    for req in params.get("required", []) or []:
        if req not in args:
            return f"missing required argument {req!r} for {spec.name}"
    if params.get("additionalProperties") is False:
        unknown = sorted(set(args) - set(props))
        if unknown:
            return f"unknown argument(s) {', '.join(map(repr, unknown))} for {spec.name}; expected {sorted(props)}"
    for key, value in args.items():
        sch = props.get(key) or {}
        t = sch.get("type")
        if isinstance(t, str) and t in _JSON_TYPES:
            ok = isinstance(value, _JSON_TYPES[t]) and not (t in ("integer", "number") and isinstance(value, bool))
            if not ok:
                return f"argument {key!r} of {spec.name} must be {t}, got {type(value).__name__}"
        if "enum" in sch and value not in sch["enum"]:
            return f"argument {key!r} of {spec.name} must be one of {sch['enum']}, got {value!r}"
    return None


def result_to_text(value: Any) -> str:
    """Show a tool's return value to the agent: text as-is, JSON values as compact JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return "OK"
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        raise ToolReturnError(f"tool returned a non-text value of type {type(value).__name__}") from None


def tool_message(call_id: str, name: str, text: str) -> Message:
    return Message(role="tool", content=text, tool_call_id=call_id, name=name, origin="environment")


def error_observations(action: Message | None, error: str) -> list[Message]:
    """One ``Error: ...`` tool message per call in ``action`` (or one user-side note if it has none).

    Used when the environment itself fails, so the transcript stays well-formed: every call is
    still answered exactly once.
    """
    text = error if error.startswith("Error") else f"Error: {error}"
    calls = (action.tool_calls or []) if action is not None else []
    if calls:
        return [tool_message(c.id, c.name, text) for c in calls]
    return [Message(role="user", content=text, origin="environment")]


class ToolDispatcher:
    """Answers tool calls by calling Python callables; see the module docstring for the rules."""

    def __init__(self, functions: dict[str, Callable[..., Any]], specs: dict[str, ToolSpec] | None = None,
                 recoverable: tuple[type[BaseException], ...] = (ToolError,)):
        self.functions = dict(functions)
        self.specs = specs or {n: function_to_toolspec(f, n) for n, f in self.functions.items()}
        self.recoverable = recoverable

    @property
    def tools(self) -> list[ToolSpec]:
        return [self.specs[n] for n in self.functions]

    def call(self, call: ToolCall) -> tuple[str, bool]:
        """Run one call; return (observation text, ok). Environment bugs propagate."""
        if call.name not in self.functions:
            return f"Error: unknown tool {call.name!r}; available tools: {', '.join(self.functions)}", False
        args = call.arguments
        if args is None:
            if call.arguments_raw:
                try:
                    args = json.loads(call.arguments_raw)
                except json.JSONDecodeError as e:
                    return f"Error: arguments of {call.name} are not valid JSON ({e.msg})", False
            else:
                args = {}
        if not isinstance(args, dict):
            return f"Error: arguments of {call.name} must be a JSON object", False
        problem = check_arguments(self.specs[call.name], args)
        if problem:
            return f"Error: {problem}", False
        try:
            value = self.functions[call.name](**args)
        except self.recoverable as e:
            return f"Error: {e}", False
        return result_to_text(value), True

    def answer(self, action: Message) -> list[Message]:
        """Tool messages answering every call of ``action``, in call order."""
        out = []
        for c in action.tool_calls or []:
            text, _ = self.call(c)
            out.append(tool_message(c.id, c.name, text))
        return out


def public_methods(obj: Any) -> dict[str, Callable[..., Any]]:
    """The public methods defined on ``obj``'s class and its bases (not ``object``), in definition order."""
    out: dict[str, Callable[..., Any]] = {}
    for klass in reversed(type(obj).__mro__):
        if klass is object:
            continue
        for name, attr in vars(klass).items():
            if name.startswith("_"):
                continue
            if inspect.isfunction(attr) or isinstance(attr, (staticmethod, classmethod)):
                out[name] = getattr(obj, name)
    return out
