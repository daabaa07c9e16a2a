"""The trajectory IR: the one record every converter produces and every algorithm consumes.

Kept free of tokenizers and torch so that data tooling stays light and importable anywhere.
The field list is documented in docs/formats.md; ``extra="forbid"`` everywhere except the
namespaced ``extra`` dicts, so a typo in a field name is an error instead of silently dropped data.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trajtune.errors import DataError, OutputError, StorageError, require_input, storage_hint

SCHEMA_VERSION = "1.0"
SUPPORTED_SCHEMA_VERSIONS = ("1.0",)

Role = Literal["system", "developer", "user", "assistant", "tool"]
Origin = Literal["user", "environment", "agent", "system"]
# Why a trajectory ended. Open-ended on purpose ("…" in the spec): adapters may add reasons.
Termination = str
KNOWN_TERMINATIONS = ("done", "max_turns", "context_overflow", "length", "env_error", "timeout")


M = TypeVar("M", bound=BaseModel)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)


class TextPart(_Strict):
    type: Literal["text"] = "text"
    text: str


class ImagePart(_Strict):
    type: Literal["image"] = "image"
    url: str | None = None
    path: str | None = None
    media_type: str | None = None
    detail: str | None = None


class WebPart(_Strict):
    type: Literal["web"] = "web"
    url: str | None = None
    html: str | None = None
    axtree: str | None = None
    viewport_size: list[int] | None = None


class JsonPart(_Strict):
    type: Literal["json"] = "json"
    data: Any = None


class PassthroughPart(_Strict):
    """A part we do not understand, kept verbatim so export can give it back."""

    type: Literal["passthrough"] = "passthrough"
    source_type: str | None = None
    raw: Any = None


ContentPart = Annotated[
    Union[TextPart, ImagePart, WebPart, JsonPart, PassthroughPart], Field(discriminator="type")
]


class CodeAction(_Strict):
    language: str
    source: str


class ToolCall(_Strict):
    id: str
    id_generated: bool = False
    type: Literal["function", "custom"] = "function"
    name: str
    arguments: dict[str, Any] | None = None
    arguments_raw: str | None = None
    input: str | None = None
    code: CodeAction | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


class ToolSpec(_Strict):
    type: str = "function"
    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None
    raw: dict[str, Any] | None = None
    extra: dict[str, Any] = Field(default_factory=dict)

    def to_openai(self) -> dict[str, Any]:
        """The shape HF chat templates and OpenAI-compatible servers expect."""
        fn: dict[str, Any] = {"name": self.name, "description": self.description, "parameters": self.parameters}
        if self.strict is not None:
            fn["strict"] = self.strict
        return {"type": "function", "function": fn}


class Message(_Strict):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    origin: Origin | None = None
    thought: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    train: bool | None = None
    reward: float | None = None
    extra: dict[str, Any] = Field(default_factory=dict)

    def text(self) -> str:
        """Content as plain text (text parts joined); non-text parts are skipped."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


class Outcome(_Strict):
    success: bool | None = None
    final_answer: str | None = None
    termination: Termination | None = None


class Reference(_Strict):
    kind: str
    data: Any = None


class Provenance(_Strict):
    source_format: str | None = None
    source_version: str | None = None
    dataset: str | None = None
    record_id: str | None = None
    converter: str | None = None


class Trajectory(_Strict):
    schema_version: str = SCHEMA_VERSION
    id: str
    messages: list[Message] = Field(default_factory=list)
    tools: list[ToolSpec] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    reward: float | None = None
    outcome: Outcome | None = None
    reference: Reference | None = None
    provenance: Provenance | None = None
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _id_non_empty(cls, v: str) -> str:
        if not v or not v.strip():
            raise ValueError("trajectory id must be a non-empty string")
        return v

    @field_validator("schema_version")
    @classmethod
    def _version_supported(cls, v: str) -> str:
        if v not in SUPPORTED_SCHEMA_VERSIONS:
            raise ValueError(f"schema_version {v!r} is not supported (supported: {', '.join(SUPPORTED_SCHEMA_VERSIONS)})")
        return v


def fill_call_id(call: ToolCall, taken: set[str], ordinal: int) -> int:
    """Give ``call`` the next free ``call_{ordinal:06d}`` id (marked generated); returns the next ordinal."""
    while f"call_{ordinal:06d}" in taken:
        ordinal += 1
    call.id = f"call_{ordinal:06d}"
    call.id_generated = True
    taken.add(call.id)
    return ordinal + 1


def generate_call_ids(traj: Trajectory) -> Trajectory:
    """Fill missing call ids deterministically (``call_{ordinal:06d}``, skipping collisions)."""
    taken = {c.id for m in traj.messages for c in (m.tool_calls or []) if c.id}
    ordinal = 0
    for m in traj.messages:
        for c in m.tool_calls or []:
            if not c.id:
                ordinal = fill_call_id(c, taken, ordinal)
    return traj


# ---------------------------------------------------------------------------------------------
# Nesting depth
#
# JSON from models and datasets can be nested arbitrarily deep, but pydantic serialisation stops
# at about 250 levels and recursive Python code at about 1000. trajtune therefore bounds depth:
# data files refuse records nested deeper than MAX_RECORD_DEPTH, and converted records holding a
# value deeper than MAX_VALUE_DEPTH (e.g. arguments parsed out of a string) (rule E112); parsers
# refuse tool-call arguments deeper than MAX_VALUE_DEPTH, and writers of model output (the eval
# store) replace any free-form value deeper than MAX_VALUE_DEPTH with DEPTH_MARKER so a run still
# finishes.

MAX_VALUE_DEPTH = 100
MAX_RECORD_DEPTH = 128
DEPTH_MARKER = f"<trajtune: value nested deeper than {MAX_VALUE_DEPTH} levels was cut here>"


def depth_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` holds containers (dict/list/tuple) nested more than ``limit`` deep.

    Iterative, so it cannot itself hit the recursion limit; stops at the first too-deep container."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            children: Iterable[Any] = v.values()
        elif isinstance(v, (list, tuple)):
            children = v
        else:
            continue
        if d >= limit:
            return True
        stack.extend((c, d + 1) for c in children if isinstance(c, (dict, list, tuple)))
    return False


def cap_depth(value: Any, limit: int = MAX_VALUE_DEPTH, marker: str = DEPTH_MARKER) -> tuple[Any, int]:
    """``(copy of value with every container deeper than limit replaced by marker, number replaced)``.

    Returns ``value`` itself (and 0) when nothing is that deep. Iterative, like ``depth_exceeds``."""
    if not depth_exceeds(value, limit):
        return value, 0
    holder: list[Any] = [None]
    cut = 0
    stack: list[tuple[Any, int, Any, Any]] = [(value, 0, holder, 0)]
    while stack:
        v, d, parent, key = stack.pop()
        if not isinstance(v, (dict, list, tuple)):
            parent[key] = v
        elif d >= limit:
            parent[key] = marker
            cut += 1
        elif isinstance(v, dict):
            new: Any = dict.fromkeys(v)
            parent[key] = new
            stack.extend((c, d + 1, new, k) for k, c in v.items())
        else:
            new = [None] * len(v)
            parent[key] = new
            stack.extend((c, d + 1, new, i) for i, c in enumerate(v))
    return holder[0], cut


def _free_values(v: Any) -> Iterator[Any]:
    """The free-form (dict/list) values inside a model: arguments, extra, metadata, JSON parts, ..."""
    if isinstance(v, BaseModel):
        for name in type(v).model_fields:
            yield from _free_values(getattr(v, name))
    elif isinstance(v, list) and any(isinstance(x, BaseModel) for x in v):
        for x in v:
            yield from _free_values(x)
    elif isinstance(v, (dict, list, tuple)):
        yield v


def model_depth_exceeds(model: BaseModel, limit: int = MAX_VALUE_DEPTH) -> bool:
    """Whether any free-form value inside ``model`` nests deeper than ``limit`` (see ``depth_exceeds``)."""
    return any(depth_exceeds(v, limit) for v in _free_values(model))


def _cap_field(v: Any, limit: int) -> tuple[Any, int]:
    if isinstance(v, BaseModel):
        return cap_model_depth(v, limit)
    if isinstance(v, list) and any(isinstance(x, BaseModel) for x in v):
        pairs = [_cap_field(x, limit) for x in v]
        n = sum(k for _, k in pairs)
        return ([x for x, _ in pairs], n) if n else (v, 0)
    if isinstance(v, (dict, list, tuple)):
        return cap_depth(v, limit)
    return v, 0


def cap_model_depth(model: M, limit: int = MAX_VALUE_DEPTH) -> tuple[M, int]:
    """``model`` (e.g. a Trajectory) with every free-form value (arguments, extra, metadata, JSON
    parts, reference data) capped by :func:`cap_depth`; untouched parts are shared, not copied."""
    updates: dict[str, Any] = {}
    n = 0
    for name in type(model).model_fields:
        new, k = _cap_field(getattr(model, name), limit)
        if k:
            updates[name] = new
            n += k
    return (model.model_copy(update=updates) if updates else model), n


# ---------------------------------------------------------------------------------------------
# JSONL I/O


class RecordError(DataError):
    """A bad input record, located precisely enough for a user to fix it."""

    def __init__(self, path: str | os.PathLike[str] | None, line: int | None, message: str,
                 rule: str = "schema", record_id: str | None = None, hint: str | None = None):
        self.path = str(path) if path is not None else None
        self.line = line
        self.rule = rule
        self.record_id = record_id
        self.hint = hint
        self.message = message
        super().__init__(self.__str__())

    def __str__(self) -> str:
        loc = self.path or "<input>"
        if self.line is not None:
            loc += f":{self.line}"
        rid = f" [id={self.record_id}]" if self.record_id else ""
        hint = f" (hint: {self.hint})" if self.hint else ""
        return f"{loc}{rid}: {self.rule}: {self.message}{hint}"


def _format_validation_error(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:5]:
        loc = ".".join(str(x) for x in err["loc"])
        parts.append(f"{loc}: {err['msg']}")
    more = f" (+{len(e.errors()) - 5} more)" if len(e.errors()) > 5 else ""
    return "; ".join(parts) + more


def parse_trajectory(obj: Any, path: str | os.PathLike[str] | None = None, line: int | None = None) -> Trajectory:
    if not isinstance(obj, dict):
        raise RecordError(path, line, f"expected a JSON object, got {type(obj).__name__}", rule="json_object")
    try:
        return Trajectory.model_validate(obj)
    except ValidationError as e:
        rid = obj.get("id") if isinstance(obj.get("id"), str) else None
        raise RecordError(path, line, _format_validation_error(e), rule="schema", record_id=rid,
                          hint="see docs/formats.md for the IR fields; convert foreign formats with `trajtune data convert`") from None


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """Yield (line_number, parsed JSON) for each non-blank line, streaming.

    Raises RecordError on invalid UTF-8 or JSON, naming the line.
    """
    p = Path(path)
    require_input(p)
    if p.is_dir():
        raise DataError(f"{p}: is a directory; pass a JSONL file (.jsonl or .jsonl.gz)")
    with p.open("rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    with (gzip.open(p, "rb") if gzipped else p.open("rb")) as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise RecordError(p, lineno, f"invalid UTF-8 at byte {e.start}", rule="utf8",
                                  hint="re-encode the file as UTF-8") from None
            if not text.strip():
                continue
            try:
                yield lineno, json.loads(text)
            except json.JSONDecodeError as e:
                raise RecordError(p, lineno, f"invalid JSON: {e.msg} at column {e.colno}", rule="json",
                                  hint="each line must be one complete JSON object") from None


def read_trajectories(path: str | os.PathLike[str]) -> Iterator[Trajectory]:
    for lineno, obj in iter_jsonl(path):
        yield parse_trajectory(obj, path, lineno)


def load_trajectories(path: str | os.PathLike[str]) -> list[Trajectory]:
    return list(read_trajectories(path))


def trajectory_to_json(traj: Trajectory) -> str:
    """One JSONL line. pydantic's JSON mode refuses a dict key holding a lone surrogate (possible in
    model output); the same content is then dumped from Python mode instead of failing the write."""
    try:
        data = traj.model_dump(mode="json", exclude_none=True, exclude_defaults=False)
    except UnicodeEncodeError:
        data = traj.model_dump(mode="python", exclude_none=True, exclude_defaults=False)
    return json.dumps(data, ensure_ascii=False, default=str)


def _output_error(path: Path, e: OSError) -> OutputError:
    """An OutputError naming the output the user asked for, never the temp file the write failed on."""
    if isinstance(e, OutputError):
        return e
    why = e.strerror or str(e)
    bad_parent = next((a for a in [path.parent, *path.parent.parents] if a.exists() and not a.is_dir()), None)
    if bad_parent is not None:
        why = f"{bad_parent} is a file, not a directory"
    elif path.is_dir():
        why = "it is a directory; name a file inside it"
    elif hint := storage_hint(e.errno):  # full, read-only, forbidden: say what to do, as the CLI does elsewhere
        return StorageError(f"cannot write {path}: {why}; {hint}")
    return OutputError(f"cannot write {path}: {why}")


def _open_temp(p: Path) -> tuple[int, str]:
    """Create ``p``'s directory and a temp file next to it; errors name ``p``."""
    try:
        if p.is_dir():
            raise IsADirectoryError(21, "is a directory", str(p))
        p.parent.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    except OSError as e:
        raise _output_error(p, e) from None


def _umask() -> int:
    """The process umask, read without changing it where the OS allows (os.umask must set it to read it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def normal_permissions(path: str | os.PathLike[str]) -> None:
    """Give ``path`` (recursively) the modes a plain ``open``/``mkdir`` would: 0666/0777 minus the umask.

    Temp files from ``mkstemp`` (and some libraries' own atomic saves, e.g. safetensors through
    transformers) are created 0600; renamed into place they would leave run outputs unreadable to
    the rest of a team."""
    mask = _umask()
    p = Path(path)
    targets = [p, *p.rglob("*")] if p.is_dir() else [p]
    for t in targets:
        if t.is_symlink():
            continue
        os.chmod(t, (0o777 if t.is_dir() else 0o666) & ~mask)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write via a temp file in the same directory and rename, so readers never see half a file."""
    p = Path(path)
    fd, tmp = _open_temp(p)
    os.fchmod(fd, 0o666 & ~_umask())
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError):
            raise _output_error(p, e) from None
        raise


class AtomicJsonlWriter:
    """Stream records to ``path.tmp`` and rename on success; on error the target is untouched."""

    def __init__(self, path: str | os.PathLike[str], overwrite: bool = False):
        self.path = Path(path)
        if self.path.exists() and not overwrite and not self.path.is_dir():
            raise OutputError(f"{self.path} exists; pass --overwrite to replace it")
        fd, self._tmp = _open_temp(self.path)
        os.fchmod(fd, 0o666 & ~_umask())
        self._f = os.fdopen(fd, "w", encoding="utf-8")
        self.count = 0

    def write(self, record: Trajectory | dict[str, Any]) -> None:
        line = trajectory_to_json(record) if isinstance(record, Trajectory) else json.dumps(record, ensure_ascii=False)
        try:
            self._f.write(line + "\n")
        except OSError as e:  # e.g. disk full: name the output, not the temp file
            raise _output_error(self.path, e) from None
        self.count += 1

    def __enter__(self) -> "AtomicJsonlWriter":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:  # keep the original error; just leave nothing behind
            self._discard()
            return
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            os.replace(self._tmp, self.path)
        except OSError as e:
            self._discard()
            raise _output_error(self.path, e) from None

    def _discard(self) -> None:
        try:
            self._f.close()
        except OSError:
            pass
        try:
            os.unlink(self._tmp)
        except FileNotFoundError:
            pass


def write_trajectories(path: str | os.PathLike[str], trajs: Iterable[Trajectory | dict[str, Any]],
                       overwrite: bool = False) -> int:
    with AtomicJsonlWriter(path, overwrite=overwrite) as w:
        for t in trajs:
            w.write(t)
    return w.count


class PreferencePair(_Strict):
    """Two attempts at one task, one preferred (DPO data; docs/formats.md "Preference pairs").

    ``level: trajectory`` compares whole attempts: every assistant turn of each side is the
    compared action. ``level: step`` compares one action from one state: both sides share their
    first ``prefix_messages`` messages, and the compared action is the assistant message right
    after them (later messages, if any, stay untrained context)."""

    schema_version: str = SCHEMA_VERSION
    id: str
    task_id: str
    level: Literal["trajectory", "step"] = "trajectory"
    chosen: Trajectory
    rejected: Trajectory
    prefix_messages: int | None = Field(None, ge=0)
    chosen_value: float | None = None
    rejected_value: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
