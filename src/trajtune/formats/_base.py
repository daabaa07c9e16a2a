"""Pieces every converter shares: the loss report, argument parsing, canonical JSON.

Kept apart from the converters so that each format module reads as a mapping table, and so the
validator can reuse the exact same argument-parsing rules the converters apply.
"""

from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from trajtune.errors import DataError
from trajtune.schema import Message, ToolCall, Trajectory, generate_call_ids


class ConversionError(DataError):
    """A record that a converter cannot map at all (wrong shape for the format).

    Carries a rule id and a hint so the CLI and the validator can report it like any other finding.
    """

    def __init__(self, message: str, *, rule: str = "E110", hint: str | None = None, record_id: str | None = None):
        super().__init__(message)
        self.message = message
        self.rule = rule
        self.hint = hint
        self.record_id = record_id


@dataclass
class ConversionReport:
    """What a single conversion lost or had to repair.

    ``losses`` are stable tokens (e.g. ``"call_ids"``, ``"reward"``) so tests and users can check
    them; ``warnings`` are human sentences about repairs or suspicious input that was kept as-is.
    """

    source_format: str = ""
    target_format: str = ""
    losses: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def lose(self, what: str) -> None:
        if what not in self.losses:
            self.losses.append(what)

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def merge(self, other: "ConversionReport") -> "ConversionReport":
        for x in other.losses:
            self.lose(x)
        for w in other.warnings:
            self.warn(w)
        return self


@runtime_checkable
class Format(Protocol):
    """What a format must provide to be registered (a module or any object with these)."""

    def to_ir(self, record: Any, *, line: int | None = None) -> tuple[Trajectory, ConversionReport]: ...

    def from_ir(self, traj: Trajectory) -> tuple[Any, ConversionReport]: ...


def expect_object(value: Any, where: str | None = None) -> dict[str, Any]:
    """``value`` if it is a JSON object; else the one error every converter gives (E105 for a whole
    record, E111 for a part of one at ``where``)."""
    if isinstance(value, dict):
        return value
    if where is None:
        raise ConversionError(f"expected a JSON object, got {type(value).__name__}", rule="E105")
    raise ConversionError(f"{where}: expected an object, got {type(value).__name__}", rule="E111")


def link_tool_results(traj: Trajectory, pairs: list[tuple[Message, ToolCall]]) -> None:
    """Fill missing call ids, then give each tool result the id of the call it answers (formats that
    pair results with calls by position rather than by id)."""
    generate_call_ids(traj)
    for msg, call in pairs:
        msg.tool_call_id = call.id


def canonical_json(obj: Any) -> str:
    """Key-order-independent JSON text, used for equality and hashing."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def content_id(prefix: str, record: Any, line: int | None = None) -> str:
    """Deterministic id for records that carry none: stable across runs and machines."""
    try:
        text = json.dumps(record, sort_keys=True, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(record)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{prefix}-{digest}"


def speaker_turn(t: Any, where: str, roles: dict[str, str], hint: str | None = None) -> tuple[str, str]:
    """(IR role, text) of a ShareGPT-style turn ``{"from"|"role": ..., "value"|"content": ...}``."""
    if not isinstance(t, dict):
        raise ConversionError(f"{where}: expected an object", rule="E111")
    frm = t.get("from", t.get("role"))
    value = t.get("value", t.get("content"))
    role = roles.get(frm) if isinstance(frm, str) else None
    if role is None:
        raise ConversionError(f"{where}: unknown speaker {frm!r}", rule="E203", hint=hint)
    if not isinstance(value, str):
        raise ConversionError(f"{where}: value must be a string", rule="E204")
    return role, value


def take_record_id(record: dict[str, Any], prefix: str, tx: dict[str, Any]) -> str:
    """The trajectory id for ``record``; notes in ``tx`` how the source spelled it so export can give it back.

    A missing, null or empty id gets a content hash (``tx["id_absent"]`` says which); a non-string id is
    kept verbatim in ``tx["id_value"]``."""
    rid = record.get("id")
    if rid is None or rid == "":
        tx["id_absent"] = "absent" if "id" not in record else ("null" if rid is None else "empty")
        return content_id(prefix, record)
    if isinstance(rid, str):
        return rid
    tx["id_value"] = rid
    return str(rid)


def restore_record_id(tx: dict[str, Any], traj_id: str) -> dict[str, Any]:
    """The ``id`` entry of an exported record, as ``take_record_id`` found it (``{}`` when it was absent)."""
    absent = tx.get("id_absent")
    if absent is None:
        return {"id": tx.get("id_value", traj_id)}
    if absent == "null":
        return {"id": None}
    if absent == "empty":
        return {"id": ""}
    return {}


_JSON_NAMES = {"true": True, "false": False, "null": None}


def literal_node_to_json(node: ast.AST) -> Any:
    """The JSON value a Python-literal AST node spells, or ValueError. Never evaluates anything.

    Accepts what ``ast.literal_eval`` accepts *and JSON can hold* (str, int, float, bool, None,
    lists, tuples as lists, dicts with string keys, signed numbers) plus JSON's own ``true``,
    ``false``, ``null`` spellings; sets, bytes, complex numbers and names are refused, since they
    could not be stored as JSON later."""
    if isinstance(node, ast.Constant):
        v = node.value
        if v is None or isinstance(v, (str, bool, int, float)):
            return v
        raise ValueError(f"{type(v).__name__} is not a JSON value")
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) and \
            isinstance(node.operand, ast.Constant) and type(node.operand.value) in (int, float):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [literal_node_to_json(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        out: dict[str, Any] = {}
        for k, v in zip(node.keys, node.values):
            key = literal_node_to_json(k) if k is not None else None
            if not isinstance(key, str):
                raise ValueError("dict keys must be strings")
            out[key] = literal_node_to_json(v)
        return out
    raise ValueError(f"{type(node).__name__} is not a literal value")


def python_literal_to_json(text: str) -> Any:
    """Parse text written as a Python literal (e.g. ``{'name': 'f', 'arguments': {'a': True}}``, the
    single-quoted form many datasets and models write instead of JSON) into a JSON value.

    Uses ``ast.parse`` and :func:`literal_node_to_json`, never ``eval``. Raises ValueError."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
        return literal_node_to_json(tree.body)
    except (SyntaxError, RecursionError, MemoryError, TypeError) as e:
        raise ValueError(f"not a Python literal: {type(e).__name__}") from None


def _json_object(text: str) -> dict[str, Any] | None:
    """The JSON object ``text`` holds, directly or double-encoded; None for anything else."""
    try:
        parsed = json.loads(text)
        if isinstance(parsed, str):
            parsed = json.loads(parsed)
    except (json.JSONDecodeError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None


def parse_arguments(raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    """Map a source ``arguments`` value to the IR pair (arguments, arguments_raw).

    Strings are kept verbatim in ``arguments_raw`` and parsed when they hold a JSON object; dicts
    are taken as-is. A double-encoded string (a JSON string whose value is a JSON object's text,
    common in scraped OpenAI logs) is decoded to that object: its content is unambiguous, the
    original stays in ``arguments_raw`` (so OpenAI export gives it back byte for byte) and the
    validator reports it (W222) — without this, exporters to object formats would write ``{}``.
    Anything else (invalid JSON, a JSON list) leaves ``arguments`` as None for the validator to
    report: converters never guess.
    """
    if isinstance(raw, dict):
        return raw, None
    if isinstance(raw, str):
        return _json_object(raw), raw
    if raw is None:
        return None, None
    # A list/number: keep its JSON text so nothing is lost, the validator flags it.
    return None, json.dumps(raw, ensure_ascii=False)


def arguments_text(arguments: dict[str, Any] | None, arguments_raw: str | None) -> str:
    """The JSON string to export for formats whose arguments are strings: the original if any."""
    if arguments_raw is not None:
        return arguments_raw
    return json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)


def arguments_dict(arguments: dict[str, Any] | None, arguments_raw: str | None, report: ConversionReport) -> dict[str, Any]:
    """The dict to export for formats whose arguments are objects; unparsable raw text is a loss."""
    if arguments is not None:
        return arguments
    if arguments_raw is not None:
        report.lose("invalid_arguments")
        report.warn(f"arguments {arguments_raw[:60]!r} are not a JSON object; exported as {{}}")
    return {}


def ns(extra: dict[str, Any], key: str) -> dict[str, Any]:
    """The namespaced sub-dict of an ``extra`` (empty dict when absent; never mutates)."""
    v = extra.get(key)
    return v if isinstance(v, dict) else {}


# Keys in a format's ``extra`` namespace that carry source data (rather than null-vs-absent
# bookkeeping). Only these make a foreign namespace count as a loss on export.
_DATA_KEYS = {"keys", "top", "custom_keys", "function_keys", "arguments_value", "kwargs_value", "id_value",
              "details_value", "image_observation_value", "source_value", "viewport_value", "raw_text", "fields"}


def foreign_extra_losses(extra: dict[str, Any], own: str, report: ConversionReport) -> None:
    """Declare ``extra.<ns>`` lost for other formats' namespaces that hold real source data."""
    for k, v in extra.items():
        if k == own:
            continue
        if not isinstance(v, dict) or any(key in _DATA_KEYS for key in v):
            report.lose(f"extra.{k}")
