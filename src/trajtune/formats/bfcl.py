"""BFCL (Berkeley Function Calling Leaderboard) records <-> the trajectory IR.

A BFCL record is ``{id, question: [[messages] per turn], function: [specs]}`` with function
specs written in BFCL's own type names (``dict``, ``float``, ``tuple``, ``any``, ...). Models
and chat templates expect JSON Schema, so ``to_ir`` translates the types; the original spec is
kept verbatim in ``ToolSpec.raw`` because BFCL's checker needs the BFCL types (``any`` is
checked as a string, ``tuple`` as a list) and ``from_ir`` must be able to give them back.

The ground truth goes into ``Trajectory.reference`` untouched (docs/formats.md: "verbatim ground
truth"): ``bfcl_ast`` for single-turn categories, ``bfcl_multi_turn`` for the stateful ones.

Public API (module level, so the formats registry can wrap it):

- ``to_ir(record, answer=None, category=None) -> Trajectory``
- ``from_ir(traj) -> dict`` (back to a BFCL record; lossless for records made by ``to_ir``)
- ``bfcl_type_to_json_schema(schema) -> dict``
- ``function_to_tool_spec(fn) -> ToolSpec``
"""

from __future__ import annotations

import copy
import re
from typing import Any

from trajtune.formats._base import ConversionReport
from trajtune.schema import Message, Provenance, Reference, ToolSpec, Trajectory

FORMAT_NAME = "bfcl"
#: What BFCL -> IR -> BFCL loses: nothing (the record is kept verbatim in the reference).
LOSSES: list[str] = []

# BFCL's Python-side type names -> JSON Schema "type". ``any`` has no JSON Schema type and is
# dropped (an empty schema accepts anything); ``tuple`` becomes an array because JSON has no
# tuples and BFCL itself compares tuples as lists.
_TYPE_MAP = {
    "dict": "object",
    "float": "number",
    "tuple": "array",
    "integer": "integer",
    "string": "string",
    "boolean": "boolean",
    "array": "array",
    "object": "object",
    "number": "number",
    "null": "null",
}

# Which categories are single-turn AST checked, which are relevance checks, which multi-turn.
MULTI_TURN_PREFIX = "multi_turn_"


def category_from_id(record_id: str) -> str:
    """``live_simple_0-0-0`` -> ``live_simple``; ``multi_turn_base_12`` -> ``multi_turn_base``."""
    m = re.match(r"^(.*?)_\d+(?:-\d+)*$", record_id)
    return m.group(1) if m else record_id


def bfcl_type_to_json_schema(schema: Any) -> Any:
    """Translate a BFCL parameter schema (recursively) into JSON Schema.

    Keys other than ``type`` (description, enum, default, items, properties, required, ...) are
    kept; unknown type names are kept as they are rather than guessed.
    """
    if isinstance(schema, list):
        return [bfcl_type_to_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            if value == "any":
                continue  # {} in JSON Schema: anything goes
            out["type"] = _TYPE_MAP.get(value, value)
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {k: bfcl_type_to_json_schema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "anyOf", "oneOf", "allOf"):
            out[key] = bfcl_type_to_json_schema(value)
        else:
            out[key] = copy.deepcopy(value)
    if schema.get("type") == "dict" and "properties" not in out:
        out["properties"] = {}
    return out


def function_to_tool_spec(fn: dict[str, Any]) -> ToolSpec:
    """One BFCL function doc -> ``ToolSpec`` (JSON Schema parameters, BFCL original in ``raw``)."""
    params = fn.get("parameters") or {"type": "dict", "properties": {}}
    schema = bfcl_type_to_json_schema(params)
    if schema.get("type") is None:
        schema["type"] = "object"
    return ToolSpec(name=fn["name"], description=fn.get("description", "") or "",
                    parameters=schema, raw=copy.deepcopy(fn))


def _messages_from_turn(turn: list[dict[str, Any]]) -> list[Message]:
    msgs = []
    for m in turn:
        role = m.get("role", "user")
        msgs.append(Message(role=role, content=m.get("content", "")))
    return msgs


def to_ir(record: dict[str, Any], answer: dict[str, Any] | None = None, category: str | None = None,
          source_version: str | None = None) -> Trajectory:
    """Convert one BFCL record (and its possible-answer record, if any) to a ``Trajectory``.

    Single-turn: messages are the record's only turn; ``reference.kind == "bfcl_ast"`` with
    ``data = {category, ground_truth, functions}`` (``ground_truth`` may be absent for the
    relevance/irrelevance categories, which have none).

    Multi-turn: messages are the first turn; the later turns, initial API state, involved
    classes, held-out functions and the per-turn ground-truth call strings go into
    ``reference.data`` (``kind == "bfcl_multi_turn"``), which is what the BFCL multi-turn
    environment replays. ``record["function"]`` must already hold the offered function docs and
    ``record["missed_function_docs"]`` the held-out ones by turn (the loader fills both from the
    package's ``multi_turn_func_doc`` files, as BFCL does); neither is given back by ``from_ir``.
    """
    rid = record.get("id")
    if not isinstance(rid, str) or not rid:
        raise ValueError("BFCL record has no string 'id'")
    category = category or category_from_id(rid)
    question = record.get("question") or [[]]
    functions = record.get("function") or []
    tools = [function_to_tool_spec(fn) for fn in functions]
    provenance = Provenance(source_format=FORMAT_NAME, source_version=source_version,
                            dataset=f"bfcl/{category}", record_id=rid, converter="trajtune.formats.bfcl")
    if answer is not None and answer.get("id") not in (None, rid):
        raise ValueError(f"answer id {answer.get('id')!r} does not match record id {rid!r}")

    if category.startswith(MULTI_TURN_PREFIX):
        data: dict[str, Any] = {
            "category": category,
            "turns": copy.deepcopy(question),
            "initial_config": copy.deepcopy(record.get("initial_config", {})),
            "involved_classes": list(record.get("involved_classes", [])),
            "missed_function": copy.deepcopy(record.get("missed_function", {})),
            "missed_function_docs": copy.deepcopy(record.get("missed_function_docs", {})),
            "functions": copy.deepcopy(functions),
            "extra_fields": {k: copy.deepcopy(v) for k, v in record.items()
                             if k not in ("id", "question", "function", "initial_config",
                                          "involved_classes", "missed_function",
                                          "missed_function_docs")},
        }
        if answer is not None:
            data["ground_truth"] = copy.deepcopy(answer.get("ground_truth"))
        first = question[0] if question else []
        return Trajectory(id=rid, messages=_messages_from_turn(first), tools=tools,
                          metadata={"bfcl_category": category, "bfcl_turns": len(question)},
                          reference=Reference(kind="bfcl_multi_turn", data=data), provenance=provenance)

    data = {"category": category, "functions": copy.deepcopy(functions),
            "extra_fields": {k: copy.deepcopy(v) for k, v in record.items()
                             if k not in ("id", "question", "function")}}
    if answer is not None:
        data["ground_truth"] = copy.deepcopy(answer.get("ground_truth"))
    if len(question) > 1:
        data["turns"] = copy.deepcopy(question)
    first = question[0] if question else []
    return Trajectory(id=rid, messages=_messages_from_turn(first), tools=tools,
                      metadata={"bfcl_category": category},
                      reference=Reference(kind="bfcl_ast", data=data), provenance=provenance)


def from_ir(traj: Trajectory) -> dict[str, Any]:
    """Give back the BFCL record (``{id, question, function, ...}``) for a ``Trajectory``.

    Uses the verbatim copies kept in ``reference.data`` / ``ToolSpec.raw`` when present; for a
    trajectory from elsewhere, the tools' JSON Schema is used as is and only the first turn
    (non-assistant, non-tool messages) is exported.
    """
    ref = traj.reference
    data = ref.data if ref is not None and isinstance(ref.data, dict) else {}
    if "turns" in data:
        question = copy.deepcopy(data["turns"])
    else:
        question = [[{"role": m.role, "content": m.text()} for m in traj.messages
                     if m.role in ("system", "user")]]
    functions = data.get("functions")
    if functions is None:
        functions = [copy.deepcopy(t.raw) if t.raw else
                     {"name": t.name, "description": t.description, "parameters": copy.deepcopy(t.parameters)}
                     for t in traj.tools]
    out: dict[str, Any] = {"id": traj.id, "question": question}
    if ref is None or ref.kind != "bfcl_multi_turn":
        # Multi-turn records carry no function docs in the file: BFCL adds them from
        # ``multi_turn_func_doc`` by ``involved_classes``, so giving them back would add a key.
        out["function"] = copy.deepcopy(functions)
    else:
        out["initial_config"] = copy.deepcopy(data.get("initial_config", {}))
        out["involved_classes"] = list(data.get("involved_classes", []))
        if data.get("missed_function"):
            out["missed_function"] = copy.deepcopy(data["missed_function"])
    for k, v in (data.get("extra_fields") or {}).items():
        out.setdefault(k, copy.deepcopy(v))
    return out


def answer_from_ir(traj: Trajectory) -> dict[str, Any] | None:
    """The possible-answer record (``{id, ground_truth}``) kept in the reference, if any."""
    ref = traj.reference
    if ref is None or not isinstance(ref.data, dict) or "ground_truth" not in ref.data:
        return None
    return {"id": traj.id, "ground_truth": copy.deepcopy(ref.data["ground_truth"])}


class _RegisteredBFCL:
    """The BFCL converter in the registry's shape: ``(value, ConversionReport)`` pairs and ``detect``.

    A BFCL question file has no answers in it, so records converted through the registry carry
    ``reference.data`` without ``ground_truth``; use ``load_bfcl`` for scored evaluation sets."""

    name = "bfcl"

    @staticmethod
    def detect(record: Any) -> float:
        if isinstance(record, dict) and isinstance(record.get("question"), list) and "function" in record:
            return 0.9
        return 0.0

    @staticmethod
    def to_ir(record: Any, *, line: int | None = None) -> tuple[Trajectory, Any]:
        if not isinstance(record, dict):
            raise ValueError(f"a BFCL record must be a JSON object, got {type(record).__name__}")
        return to_ir(record), ConversionReport(source_format="bfcl", target_format="ir")

    @staticmethod
    def from_ir(traj: Trajectory) -> tuple[dict[str, Any], Any]:
        rep = ConversionReport(source_format="ir", target_format="bfcl")
        if any(m.role in ("assistant", "tool") for m in traj.messages):
            rep.lose("assistant_and_tool_turns")
        if traj.reward is not None or traj.outcome is not None:
            rep.lose("reward")
        return from_ir(traj), rep


EXTRA_FORMATS = {"bfcl": _RegisteredBFCL()}
