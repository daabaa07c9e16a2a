"""xLAM function-calling rows (``Salesforce/xlam-function-calling-60k``, APIGen) <-> IR.

A row is ``{"id", "query", "answers", "tools"}`` where ``answers`` and ``tools`` are *JSON strings*:
``answers`` a list of ``{"name", "arguments": {...}}`` (the calls that answer the query, often
parallel), ``tools`` a list of ``{"name", "description", "parameters": {param: {"type": "str",
"description", "default"?}}}`` whose types are Python spellings (``str``, ``List[int]``,
``str, optional``), not JSON Schema.

The IR is the single-turn function-calling shape: a user turn (the query) and an assistant turn
holding the calls, with no tool results — the calls are the training target (see
``trajtune.validate``: such a final call needs no result). Tool parameters are translated to JSON
Schema for templates and validation; the original spec stays in ``ToolSpec.raw`` and the original
JSON strings in ``extra``, so a row converted and exported unchanged comes back byte for byte.
"""

from __future__ import annotations

import json
import re
from typing import Any

from trajtune.formats._base import (
    ConversionError,
    ConversionReport,
    arguments_dict,
    expect_object,
    ns,
    parse_arguments,
    restore_record_id,
    take_record_id,
)
from trajtune.formats._common_export import declare_message_losses, declare_trajectory_losses
from trajtune.schema import Message, Provenance, ToolCall, ToolSpec, Trajectory, generate_call_ids

NAME = "xlam-fc"
ALIASES = ("xlam-60k", "xlam-function-calling-60k", "apigen")
_KEYS = ("id", "query", "answers", "tools")
_HINT = 'rows are {"id", "query": str, "answers": "[{\\"name\\": ..., \\"arguments\\": {...}}]", "tools": "[...]"}'

# Python type spellings used by xLAM tool specs -> JSON Schema types (unknown: no type, anything goes).
_PY_TYPES = {"str": "string", "string": "string", "int": "integer", "integer": "integer", "float": "number",
             "number": "number", "bool": "boolean", "boolean": "boolean", "list": "array", "tuple": "array",
             "array": "array", "dict": "object", "object": "object"}
_JSON_TO_PY = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "array": "List",
               "object": "Dict"}


def detect(record: Any) -> float:
    if isinstance(record, dict) and isinstance(record.get("query"), str) and "answers" in record and "tools" in record:
        return 0.95
    return 0.0


def _json_field(record: dict[str, Any], key: str, tx: dict[str, Any]) -> list[Any]:
    """``record[key]`` as a list: decoded from its JSON string (the text kept in ``tx`` if a
    re-encoding would not give it back) or taken as-is when the row already holds a list."""
    value = record.get(key)
    tx[f"{key}_string"] = isinstance(value, str)
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except (json.JSONDecodeError, RecursionError) as e:
            msg = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deep"
            raise ConversionError(f"'{key}' is not valid JSON ({msg})", rule="E111", hint=_HINT) from None
        if json.dumps(decoded, ensure_ascii=False) != value:
            tx[f"{key}_text"] = value
        value = decoded
    if not isinstance(value, list):
        raise ConversionError(f"'{key}' must be a list (or a JSON string holding one), got {type(value).__name__}",
                              rule="E111", hint=_HINT)
    return value


def _param_schema(spec: Any) -> tuple[dict[str, Any], bool]:
    """(JSON Schema of one xLAM parameter, whether it is required)."""
    if not isinstance(spec, dict):
        return {}, False
    out: dict[str, Any] = {}
    t = spec.get("type")
    optional = "default" in spec
    if isinstance(t, str):
        base, _, rest = t.partition(",")
        optional = optional or "optional" in rest.lower()
        head = re.split(r"[\[\s]", base.strip(), maxsplit=1)[0].lower()
        if head in _PY_TYPES:
            out["type"] = _PY_TYPES[head]
    if isinstance(spec.get("description"), str):
        out["description"] = spec["description"]
    if "default" in spec:
        out["default"] = spec["default"]
    return out, not optional


def tool_to_spec(t: Any, where: str) -> ToolSpec:
    """One xLAM tool as a ToolSpec (JSON Schema parameters; the original kept in ``raw``)."""
    if not isinstance(t, dict) or not isinstance(t.get("name"), str):
        raise ConversionError(f"{where}: a tool needs a 'name'", rule="E111", hint=_HINT)
    params = t.get("parameters")
    if isinstance(params, dict) and params.get("type") == "object":
        schema = params  # already JSON Schema
    else:
        props: dict[str, Any] = {}
        required: list[str] = []
        for pname, pspec in (params or {}).items() if isinstance(params, dict) else []:
            props[pname], req = _param_schema(pspec)
            if req:
                required.append(pname)
        schema = {"type": "object", "properties": props}
        if required:
            schema["required"] = required
    desc = t.get("description")
    return ToolSpec(name=t["name"], description=desc if isinstance(desc, str) else "", parameters=schema, raw=t)


def _answer_to_call(a: Any, where: str) -> ToolCall:
    if not isinstance(a, dict) or not isinstance(a.get("name"), str):
        raise ConversionError(f"{where}: each answer needs a 'name'", rule="E111", hint=_HINT)
    args, raw = parse_arguments(a.get("arguments", {}))
    return ToolCall(id="", name=a["name"], arguments=args, arguments_raw=raw)


def to_ir(record: Any, *, line: int | None = None) -> tuple[Trajectory, ConversionReport]:
    report = ConversionReport(source_format=NAME, target_format="ir")
    expect_object(record)
    if not isinstance(record.get("query"), str):
        raise ConversionError("'query' must be a string", rule="E111", hint=_HINT)
    tx: dict[str, Any] = {}
    tid = take_record_id(record, "xlam-fc", tx)
    answers = _json_field(record, "answers", tx)
    tools = [tool_to_spec(t, f"tools[{i}]") for i, t in enumerate(_json_field(record, "tools", tx))]
    messages = [Message(role="user", content=record["query"])]
    if answers:
        messages.append(Message(role="assistant", tool_calls=[_answer_to_call(a, f"answers[{i}]")
                                                              for i, a in enumerate(answers)]))
    else:
        report.warn("'answers' is empty: the row has no call to learn (no assistant turn)")
    top = {k: v for k, v in record.items() if k not in _KEYS}
    if top:
        tx["top"] = top
    traj = Trajectory(id=tid, messages=messages, tools=tools, extra={NAME: tx} if tx else {},
                      provenance=Provenance(source_format=NAME, record_id=None if record.get("id") is None
                                            else str(record["id"]), converter="trajtune.formats.xlam_fc"))
    generate_call_ids(traj)
    return traj, report


def _spec_to_tool(t: ToolSpec, report: ConversionReport) -> dict[str, Any]:
    if t.raw is not None and isinstance(t.raw.get("parameters", {}), dict) and t.raw.get("name") == t.name:
        return t.raw
    props = t.parameters.get("properties") if isinstance(t.parameters.get("properties"), dict) else {}
    required = set(t.parameters.get("required") or [])
    params = {}
    for pname, ps in props.items():
        ps = ps if isinstance(ps, dict) else {}
        py = _JSON_TO_PY.get(ps.get("type"), "Any") + ("" if pname in required else ", optional")
        params[pname] = {"description": ps.get("description", ""), "type": py,
                         **({"default": ps["default"]} if "default" in ps else {})}
        if set(ps) - {"type", "description", "default"}:
            report.lose("tool_schema")
    return {"name": t.name, "description": t.description, "parameters": params}


def _as_field(value: list[Any], key: str, tx: dict[str, Any]) -> Any:
    """The list back in the row's own spelling: the original text when unchanged, else JSON text."""
    if not tx.get(f"{key}_string", True):
        return value
    text = tx.get(f"{key}_text")
    if isinstance(text, str):
        try:
            if json.loads(text) == value:
                return text
        except json.JSONDecodeError:
            pass
    return json.dumps(value, ensure_ascii=False)


def from_ir(traj: Trajectory) -> tuple[dict[str, Any], ConversionReport]:
    """The first user turn as ``query`` and the calls of the last assistant turn as ``answers``;
    every other turn (results, answers in text, later user turns) is declared lost."""
    report = ConversionReport(source_format="ir", target_format=NAME)
    declare_trajectory_losses(traj, NAME, report)
    tx = ns(traj.extra, NAME)
    users = [m for m in traj.messages if m.role == "user"]
    calls_msg = next((m for m in reversed(traj.messages) if m.role == "assistant" and m.tool_calls), None)
    for m in traj.messages:
        declare_message_losses(m, NAME, report, keeps_ids=False)
        if m is (users[0] if users else None) or m is calls_msg:
            continue
        report.lose("turns")
    if calls_msg is not None and calls_msg.text():
        report.lose("assistant_text")
    answers = []
    for c in calls_msg.tool_calls if calls_msg is not None else []:
        if c.type == "custom":
            args: dict[str, Any] = {"input": c.input} if c.input is not None else {}
        else:
            args = arguments_dict(c.arguments, c.arguments_raw, report)
        answers.append({"name": c.name, "arguments": args})
    rec: dict[str, Any] = restore_record_id(tx, traj.id)
    rec["query"] = users[0].text() if users else ""
    rec["answers"] = _as_field(answers, "answers", tx)
    rec["tools"] = _as_field([_spec_to_tool(t, report) for t in traj.tools], "tools", tx)
    rec.update(tx.get("top", {}))
    return rec, report
