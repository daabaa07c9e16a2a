"""External trajectory formats: a registry of converters plus streaming loaders.

Each format is a module (or any object) with ``to_ir(record, *, line=None)`` and
``from_ir(traj)``, both returning ``(value, ConversionReport)``, and optionally
``detect(record) -> float`` (0..1 confidence) for auto-detection. Register new formats with
:func:`register_format`; the rest of trajtune (training configs, ``trajtune data``) only calls
:func:`load_any` / :func:`get_format`, so a new module needs no other wiring.

Built-in modules listed in ``_BUILTIN`` are registered on first use under their ``NAME`` (plus any
``EXTRA_FORMATS`` they define); a listed module that does not exist yet (e.g. ``bfcl``) is skipped.
Converters raise :class:`ConversionError` (with a rule id from ``trajtune.validate``) for records
that do not fit, and never repair data silently: repairs go into ``ConversionReport.warnings``.
"""

from __future__ import annotations

import importlib
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from trajtune.errors import DataError
from trajtune.formats._base import ConversionError, ConversionReport, Format, canonical_json
from trajtune.formats._io import DEFAULT_MAX_LINE_BYTES, Line, is_blank, iter_json_lines
from trajtune.schema import MAX_VALUE_DEPTH, RecordError, Trajectory, model_depth_exceeds, parse_trajectory

__all__ = [
    "ConversionError", "ConversionReport", "Format", "FormatDetectionError", "LoadStats", "RecordCheck", "canonical_json",
    "detect_format", "get_format", "iter_records", "list_formats", "load_any", "register_format", "too_deep",
]


class FormatDetectionError(DataError):
    """The format of a file could not be decided; the message lists what was considered."""


class _IRFormat:
    """The native IR as a format, so ``--from ir`` / ``format: ir`` go through the same path."""

    NAME = "ir"

    @staticmethod
    def detect(record: Any) -> float:
        if isinstance(record, dict) and isinstance(record.get("schema_version"), str) and \
                record.get("schema_version", "").count(".") == 1 and "messages" in record and "id" in record:
            return 1.0
        return 0.0

    @staticmethod
    def to_ir(record: Any, *, line: int | None = None) -> tuple[Trajectory, ConversionReport]:
        return parse_trajectory(record, None, line), ConversionReport(source_format="ir", target_format="ir")

    @staticmethod
    def from_ir(traj: Trajectory) -> tuple[dict[str, Any], ConversionReport]:
        return traj.model_dump(mode="json", exclude_none=True), ConversionReport(source_format="ir", target_format="ir")


_REGISTRY: dict[str, Any] = {}
_ALIASES: dict[str, str] = {"trajtune": "ir", "llamafactory": "sharegpt", "llama-factory": "sharegpt",
                            "actionstudio": "xlam", "qwen": "hermes", "fireact": "react", "agentinstruct": "react",
                            "openai-chat": "openai", "chat": "openai"}
# Built-in modules are imported lazily so importing trajtune.formats stays cheap.
_BUILTIN = ["openai", "adp", "sharegpt", "xlam", "xlam_fc", "react", "hermes", "bfcl"]
_loaded_builtins = False


def register_format(name: str, fmt: Any, *, aliases: tuple[str, ...] = ()) -> None:
    """Register a converter under ``name`` (replacing any previous one of that name)."""
    if not callable(getattr(fmt, "to_ir", None)) or not callable(getattr(fmt, "from_ir", None)):
        raise TypeError(f"format {name!r} must provide to_ir(record, *, line=None) and from_ir(traj)")
    _REGISTRY[name] = fmt
    for a in aliases:
        _ALIASES[a] = name


def _ensure_builtins() -> None:
    global _loaded_builtins
    if _loaded_builtins:
        return
    _loaded_builtins = True
    register_format("ir", _IRFormat())
    for mod in _BUILTIN:
        if mod in _REGISTRY:
            continue
        try:
            m = importlib.import_module(f"trajtune.formats.{mod}")
        except ModuleNotFoundError as e:  # a format module not written yet (e.g. bfcl on this branch)
            if e.name == f"trajtune.formats.{mod}":
                continue
            raise
        if callable(getattr(m, "to_ir", None)):
            register_format(getattr(m, "NAME", mod), m, aliases=tuple(getattr(m, "ALIASES", ())))
        for extra_name, obj in getattr(m, "EXTRA_FORMATS", {}).items():
            register_format(extra_name, obj)


def list_formats() -> list[str]:
    _ensure_builtins()
    return sorted(_REGISTRY)


def get_format(name: str) -> Any:
    """The converter registered as ``name`` (aliases such as ``llamafactory`` accepted)."""
    _ensure_builtins()
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in _REGISTRY:
        raise KeyError(f"unknown format {name!r}; known formats: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[key]


def detect_format(first_record: Any) -> str:
    """Name of the format ``first_record`` is in; raises FormatDetectionError when unsure."""
    _ensure_builtins()
    scores: list[tuple[float, str]] = []
    for name, fmt in _REGISTRY.items():
        det = getattr(fmt, "detect", None)
        if det is None:
            continue
        try:
            s = float(det(first_record))
        except Exception:  # a detector must never break detection of the others
            s = 0.0
        if s > 0:
            scores.append((s, name))
    scores.sort(reverse=True)
    if not scores or scores[0][0] < 0.5:
        keys = sorted(first_record)[:8] if isinstance(first_record, dict) else type(first_record).__name__
        raise FormatDetectionError(
            f"could not recognise the format (top-level keys: {keys}); pass --from/format: one of {', '.join(sorted(_REGISTRY))}")
    if len(scores) > 1 and scores[1][0] == scores[0][0]:
        tied = [n for s, n in scores if s == scores[0][0]]
        raise FormatDetectionError(f"ambiguous format: the record fits {', '.join(sorted(tied))} equally; pass --from/format: explicitly")
    return scores[0][1]


@dataclass
class LoadStats:
    """Counts from one streaming load, filled in as the iterator advances."""

    format: str | None = None
    records: int = 0
    converted: int = 0
    skipped: int = 0
    bom: bool = False
    by_rule: Counter = field(default_factory=Counter)
    losses: Counter = field(default_factory=Counter)
    errors: list[RecordError] = field(default_factory=list)
    max_errors_kept: int = 50

    def add_error(self, err: RecordError) -> None:
        self.skipped += 1
        self.by_rule[err.rule] += 1
        if len(self.errors) < self.max_errors_kept:
            self.errors.append(err)


def _record_id(obj: Any) -> str | None:
    if isinstance(obj, dict):
        for k in ("id", "unique_trajectory_id", "trajectory_id"):
            if isinstance(obj.get(k), (str, int)) and not isinstance(obj.get(k), bool):
                return str(obj[k])
    return None


RecordCheck = Callable[[Trajectory, int], "RecordError | None"]


def too_deep(traj: Trajectory, ln: Line, path: str | os.PathLike[str] | None = None) -> RecordError | None:
    """E112 for a converted record holding a value nested deeper than ``MAX_VALUE_DEPTH`` (e.g. tool-call
    arguments parsed out of a string): such values break serialisation later, far from their line."""
    if ln.brackets <= MAX_VALUE_DEPTH or not model_depth_exceeds(traj, MAX_VALUE_DEPTH):
        return None
    return RecordError(path, ln.lineno, f"a value (e.g. tool-call arguments) is nested deeper than {MAX_VALUE_DEPTH} levels",
                       rule="E112", record_id=traj.id, hint="flatten the deeply nested value")


def iter_records(path: str | os.PathLike[str], format: str | None = None, skip_invalid: bool = False,
                 stats: LoadStats | None = None, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
                 check: RecordCheck | None = None) -> Iterator[tuple[int, Trajectory, ConversionReport]]:
    """Stream ``(line, trajectory, report)`` from a JSONL file (plain or gzip) in any registered format.

    Bad lines raise :class:`RecordError` (file, line, rule, hint) unless ``skip_invalid``, in
    which case they are counted in ``stats``. ``check(trajectory, line)`` may reject a converted
    record the same way (``trajtune.validate.record_check`` applies the validation rules), so
    every command that reads data can refuse exactly what ``trajtune data validate`` rejects.
    """
    _ensure_builtins()
    stats = stats if stats is not None else LoadStats()
    fmt = get_format(format) if format else None
    name = None
    if format:
        name = _ALIASES.get(format.lower(), format.lower())
    stats.format = name
    for ln in iter_json_lines(path, max_line_bytes=max_line_bytes):
        if ln.bom:
            stats.bom = True
        if is_blank(ln):
            continue
        stats.records += 1
        err: RecordError | None = None
        if ln.problem is not None:
            err = RecordError(path, ln.lineno, ln.problem.message, rule=ln.problem.rule, hint=ln.problem.hint)
        else:
            if fmt is None:
                try:
                    name = detect_format(ln.value)
                except FormatDetectionError as e:
                    raise RecordError(path, ln.lineno, str(e), rule="E107", record_id=_record_id(ln.value),
                                      hint="name the format explicitly (--from / data.format)") from None
                fmt = get_format(name)
                stats.format = name
            try:
                traj, rep = fmt.to_ir(ln.value, line=ln.lineno)
            except ConversionError as e:
                err = RecordError(path, ln.lineno, e.message, rule=e.rule, record_id=e.record_id or _record_id(ln.value),
                                  hint=e.hint or f"check the record against the {name} format")
            except RecordError as e:
                err = RecordError(path, ln.lineno, e.message, rule="E111" if e.rule == "schema" else
                                  ("E105" if e.rule == "json_object" else e.rule),
                                  record_id=e.record_id or _record_id(ln.value), hint=e.hint)
            except ValidationError as e:
                first = e.errors()[0]
                loc = ".".join(str(x) for x in first["loc"])
                err = RecordError(path, ln.lineno, f"{loc}: {first['msg']}", rule="E111", record_id=_record_id(ln.value),
                                  hint="a field has the wrong type for the IR; fix the source record")
            except (TypeError, AttributeError, KeyError, IndexError, ValueError, RecursionError) as e:
                # A converter bug on odd input must still name the line instead of killing a long run.
                err = RecordError(path, ln.lineno, f"converter {name} failed: {type(e).__name__}: {e}", rule="E110",
                                  record_id=_record_id(ln.value), hint="this record has an unexpected shape; please report it")
            else:
                err = too_deep(traj, ln, path) or (check(traj, ln.lineno) if check is not None else None)
        if err is not None:
            if not skip_invalid:
                raise err
            stats.add_error(err)
            continue
        stats.converted += 1
        for loss in rep.losses:
            stats.losses[loss] += 1
        yield ln.lineno, traj, rep


def load_any(path: str | os.PathLike[str], format: str | None = None, skip_invalid: bool = False,
             stats: LoadStats | None = None, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
             check: RecordCheck | None = None) -> Iterator[Trajectory]:
    """Stream trajectories from ``path`` in ``format`` (auto-detected from the first record when None).

    This is what training and eval configs call for ``data: {path, format}``.
    """
    for _, traj, _ in iter_records(path, format, skip_invalid=skip_invalid, stats=stats, max_line_bytes=max_line_bytes,
                                   check=check):
        yield traj
