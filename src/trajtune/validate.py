"""The validation rules of docs/formats.md, with stable rule ids, severities and fix hints.

Rule ids carry their default severity (``E…`` error, ``W…`` warning). A finding's ``severity``
may differ from the id's letter in one documented case: ``W215`` (tool results out of order) is
an error when the data is meant for OpenAI export (``export_format="openai"``), because the
OpenAI API rejects it while chat templates merely render it oddly.

The validator reports; it never fixes data (fixing is a conversion, with a declared report).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import ValidationError

from trajtune.folding import expand_folds_indexed, is_folded
from trajtune.formats import ConversionError, FormatDetectionError, detect_format, get_format, too_deep
from trajtune.formats._io import DEFAULT_MAX_LINE_BYTES, is_blank, iter_json_lines
from trajtune.schema import (
    SUPPORTED_SCHEMA_VERSIONS,
    ImagePart,
    Message,
    RecordError,
    ToolCall,
    Trajectory,
)


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    description: str
    hint: str

    @property
    def severity(self) -> str:
        return self.id[0]


_RULES = [
    # input / file level
    Rule("E101", "json-invalid", "line is not valid JSON", "each line must be one complete JSON object"),
    Rule("E102", "json-truncated", "last line is cut off", "the file was truncated; re-export it or drop the last line"),
    Rule("E103", "utf8-invalid", "line is not valid UTF-8", "re-encode the file as UTF-8"),
    Rule("E104", "file-empty", "file holds no records", "check the path; an empty dataset trains nothing"),
    Rule("E105", "not-object", "record is not a JSON object", "each line must be a JSON object, not a list or scalar"),
    Rule("E106", "line-too-long", "line exceeds the size limit", "move huge observations out of the record or raise --max-line-mb"),
    Rule("E107", "format-unknown", "record format could not be detected", "pass --from / data.format explicitly"),
    Rule("W108", "bom", "file starts with a UTF-8 byte-order mark", "save the file as UTF-8 without BOM"),
    Rule("W109", "conversion-warning", "the converter had to interpret suspicious input", "inspect the record; see the message"),
    Rule("E110", "convert-failed", "record does not fit the declared format", "check the record against the format's shape"),
    Rule("E111", "wrong-type", "a field has the wrong type", "fix the field's type (see docs/formats.md)"),
    Rule("E112", "too-deep", "record is nested too deep to process safely", "flatten the deeply nested value"),
    # trajectory structure
    Rule("E201", "id-empty", "trajectory id missing or empty", "give every trajectory a non-empty string id"),
    Rule("E202", "schema-version", "schema_version not supported", f"use schema_version {SUPPORTED_SCHEMA_VERSIONS[-1]!r}"),
    Rule("E203", "role-invalid", "message role is not valid", "roles are system, developer, user, assistant, tool"),
    Rule("E204", "content-type", "content type not valid for the role", "system text only; assistant text (or null with tool_calls); tool/user text or parts"),
    Rule("E205", "tool-calls-role", "tool_calls on a non-assistant message", "only assistant messages make tool calls"),
    Rule("E206", "tool-call-id-role", "tool_call_id on a non-tool message", "only tool messages answer calls"),
    Rule("E207", "thought-role", "thought/reasoning on a non-assistant message", "move the rationale to the assistant message"),
    Rule("W208", "id-duplicate", "trajectory id used by an earlier record of the file",
         "give every trajectory its own id (`trajtune data dedup` drops exact copies)"),
    # calls and results
    Rule("E210", "call-id-duplicate", "tool call id used twice in a trajectory", "make call ids unique (or drop them and let trajtune generate)"),
    Rule("E211", "result-orphan", "tool message answers no earlier call", "set tool_call_id to the id of an earlier call"),
    Rule("E212", "call-unanswered", "tool call in the middle of a trajectory has no tool result",
         "add the tool message or drop the call (a call in the last message needs none: it is the training target)"),
    Rule("W213", "final-call-unanswered", "final finish-style call has no result", "fine for agent data ending in finish; add a result if your template needs one"),
    Rule("E214", "call-answered-twice", "tool call answered by more than one tool message", "merge the results into one tool message"),
    Rule("W215", "result-order", "tool results not contiguous or not in call order", "put results right after their assistant message, in call order"),
    # arguments and tools
    Rule("E220", "arguments-invalid", "arguments are not a JSON object", "arguments must be a JSON object with string keys (no NaN/Infinity)"),
    Rule("E221", "arguments-raw-mismatch", "arguments_raw does not parse to arguments", "regenerate arguments_raw from arguments (or drop it)"),
    Rule("W222", "arguments-double-encoded", "arguments are JSON encoded twice", "decode the arguments once: they should be an object, not a string holding JSON"),
    Rule("W223", "arguments-schema", "arguments violate the tool's JSON Schema", "fix the arguments or the tool's parameters schema"),
    Rule("W224", "tool-undeclared", "called tool is not declared in tools", "add the tool spec to 'tools' (built-ins such as finish are allowed)"),
    Rule("E230", "code-action-incomplete", "code action lacks language or source", "code actions need both language and source"),
    Rule("E231", "image-source", "image part needs exactly one of url/path", "set either url or path on the image part"),
    Rule("E240", "utf8-surrogate", "string holds a lone UTF-16 surrogate", "fix the escaping that produced \\udXXX; strings must be valid Unicode"),
    # training hints
    Rule("W250", "train-non-assistant", "train=true on a non-assistant message", "loss is only computed on assistant messages"),
    Rule("W251", "think-unbalanced", "unbalanced <think> tags", "close every <think> with </think>"),
    Rule("W252", "sft-last-not-assistant", "SFT record does not end with an assistant turn", "end with the assistant turn to learn, or drop the trailing turns"),
]
RULES: dict[str, Rule] = {r.id: r for r in _RULES}

# Calls a final turn may leave unanswered without an error, and that need no tool spec.
BUILTIN_TOOLS = frozenset({"finish", "final_answer", "submit", "answer", "respond", "stop", "done", "think"})


@dataclass
class Finding:
    rule: str
    severity: str
    message: str
    hint: str
    file: str | None = None
    line: int | None = None
    trajectory_id: str | None = None
    message_index: int | None = None

    @property
    def name(self) -> str:
        return RULES[self.rule].name if self.rule in RULES else self.rule

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["name"] = self.name
        return d

    def __str__(self) -> str:
        loc = (self.file or "<input>") + (f":{self.line}" if self.line is not None else "")
        tid = f" [{self.trajectory_id}]" if self.trajectory_id else ""
        mi = f" messages[{self.message_index}]" if self.message_index is not None else ""
        return f"{loc}{tid}{mi}: {self.severity} {self.rule} {self.name}: {self.message} (fix: {self.hint})"


def _finding(rule: str, message: str, *, severity: str | None = None, hint: str | None = None, **loc: Any) -> Finding:
    r = RULES[rule]
    return Finding(rule=rule, severity=severity or r.severity, message=message, hint=hint or r.hint, **loc)


# --------------------------------------------------------------------------- JSON Schema (subset)

_TYPES = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def schema_violations(value: Any, schema: Any, path: str = "") -> list[str]:
    """The subset of JSON Schema tool specs use: type, enum, required, properties,
    additionalProperties=false, items. Unknown keywords are ignored rather than guessed."""
    if not isinstance(schema, dict):
        return []
    out: list[str] = []
    where = path or "arguments"
    t = schema.get("type")
    types = t if isinstance(t, list) else ([t] if isinstance(t, str) else [])
    known = [x for x in types if x in _TYPES]
    if known and not any(_TYPES[x](value) for x in known):
        out.append(f"{where}: expected {'/'.join(known)}, got {type(value).__name__}")
        return out
    if isinstance(schema.get("enum"), list) and value not in schema["enum"]:
        out.append(f"{where}: {value!r} not in enum {schema['enum']}")
    if isinstance(value, dict):
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        for req in schema.get("required") or []:
            if isinstance(req, str) and req not in value:
                out.append(f"{where}: missing required {req!r}")
        if schema.get("additionalProperties") is False:
            for k in value:
                if k not in props:
                    out.append(f"{where}: unknown key {k!r}")
        for k, sub in props.items():
            if k in value:
                out.extend(schema_violations(value[k], sub, f"{where}.{k}"))
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            out.extend(schema_violations(v, schema["items"], f"{where}[{i}]"))
    return out


# --------------------------------------------------------------------------- helpers


def find_surrogates(obj: Any, path: str = "$", limit: int = 5) -> list[str]:
    """JSON paths of strings holding lone surrogates (``json`` accepts ``"\\ud800"``)."""
    found: list[str] = []
    stack: list[tuple[Any, str]] = [(obj, path)]
    while stack and len(found) < limit:
        o, p = stack.pop()
        if isinstance(o, str):
            try:
                o.encode("utf-8")
            except UnicodeEncodeError:
                found.append(p)
        elif isinstance(o, dict):
            for k, v in o.items():
                if isinstance(k, str):
                    try:
                        k.encode("utf-8")
                    except UnicodeEncodeError:
                        found.append(f"{p}.<key>")
                stack.append((v, f"{p}.{k}"))
        elif isinstance(o, list):
            stack.extend((v, f"{p}[{i}]") for i, v in enumerate(o))
    return found


def _strictly_serializable(obj: Any) -> str | None:
    try:
        json.dumps(obj, allow_nan=False)
    except (ValueError, TypeError) as e:
        return str(e)
    return None


def _is_finish(name: str) -> bool:
    return name.lower() in BUILTIN_TOOLS


def _raw_matches(raw: str, args: dict[str, Any]) -> str:
    """``same`` if ``raw`` parses to ``args``, ``double`` if it parses to a string that parses to
    ``args`` (double-encoded), else ``differs``."""
    try:
        once = json.loads(raw)
        if once == args:
            return "same"
        if isinstance(once, str) and json.loads(once) == args:
            return "double"
    except (json.JSONDecodeError, RecursionError):
        pass
    return "differs"


def _check_arguments(c: ToolCall, traj: Trajectory, loc: dict[str, Any], out: list[Finding]) -> None:
    if c.code is not None:
        if not c.code.language or not c.code.source:
            out.append(_finding("E230", f"call {c.id}: code action needs language and source", **loc))
        return
    if c.type == "custom":
        return
    args = c.arguments
    if args is None:
        if c.arguments_raw is None:
            out.append(_finding("E220", f"call {c.id} ({c.name}): arguments missing", **loc))
            return
        try:
            parsed = json.loads(c.arguments_raw)
        except (json.JSONDecodeError, RecursionError):
            out.append(_finding("E220", f"call {c.id} ({c.name}): arguments are not valid JSON: {c.arguments_raw[:60]!r}", **loc))
            return
        if isinstance(parsed, str):
            try:
                inner = json.loads(parsed)
            except (json.JSONDecodeError, RecursionError):
                inner = None
            if isinstance(inner, dict):
                out.append(_finding("W222", f"call {c.id} ({c.name}): arguments are a JSON string holding JSON", **loc))
                return
        out.append(_finding("E220", f"call {c.id} ({c.name}): arguments are a JSON {type(parsed).__name__}, not an object", **loc))
        return
    if any(not isinstance(k, str) for k in args):
        out.append(_finding("E220", f"call {c.id} ({c.name}): argument keys must be strings", **loc))
        return
    err = _strictly_serializable(args)
    if err:
        out.append(_finding("E220", f"call {c.id} ({c.name}): arguments not strictly JSON-serializable ({err})", **loc))
        return
    if c.arguments_raw is not None:
        raw_says = _raw_matches(c.arguments_raw, args)
        if raw_says == "double":
            out.append(_finding("W222", f"call {c.id} ({c.name}): arguments_raw is a JSON string holding the "
                                        "arguments (double-encoded); arguments hold the decoded object", **loc))
        elif raw_says != "same":
            out.append(_finding("E221", f"call {c.id} ({c.name}): arguments_raw does not parse to arguments", **loc))
    if len(args) == 1 and isinstance(args.get("arguments"), str):
        try:
            inner = json.loads(args["arguments"])
        except (json.JSONDecodeError, RecursionError):
            inner = None
        if isinstance(inner, dict):
            out.append(_finding("W222", f"call {c.id} ({c.name}): arguments wrapped as {{\"arguments\": \"<json>\"}}", **loc))
            return
    spec = next((t for t in traj.tools if t.name == c.name), None)
    if spec is not None:
        v = schema_violations(args, spec.parameters)
        if v:
            more = f" (+{len(v) - 3} more)" if len(v) > 3 else ""
            out.append(_finding("W223", f"call {c.id} ({c.name}): " + "; ".join(v[:3]) + more, **loc))


def _content_ok(m: Message) -> str | None:
    """Why ``m.content`` is not valid for its role, or None."""
    c = m.content
    if c is None:
        if m.role == "assistant":
            return None if m.tool_calls else "assistant message has neither content nor tool_calls"
        return f"{m.role} message has null content"
    if isinstance(c, str):
        return None
    kinds = {p.type for p in c}
    if m.role in ("system", "developer") and kinds - {"text", "passthrough"}:
        return f"{m.role} content may only hold text parts, found {sorted(kinds - {'text', 'passthrough'})}"
    if m.role == "assistant" and kinds - {"text", "json", "passthrough"}:
        return f"assistant content may not hold {sorted(kinds - {'text', 'json', 'passthrough'})} parts"
    return None


# --------------------------------------------------------------------------- trajectory rules


def validate_trajectory(traj: Trajectory, *, file: str | None = None, line: int | None = None,
                        export_format: str | None = None, sft: bool = True, check_strings: bool = True) -> list[Finding]:
    """All IR-level rules on one trajectory (input-level rules live in :func:`iter_findings`).

    ``check_strings`` walks every string for lone surrogates (E240); file validation does that on
    the raw record instead, where the JSON path is more useful, and turns it off here.
    """
    if is_folded(traj) and "fold_row" not in traj.metadata:
        return _folded_findings(traj, file=file, line=line, export_format=export_format, sft=sft,
                                check_strings=check_strings)
    out: list[Finding] = []
    base = {"file": file, "line": line, "trajectory_id": traj.id}
    if check_strings:
        for p in find_surrogates(traj.model_dump(mode="python"), "$"):
            out.append(_finding("E240", f"lone surrogate in {p}", **base))
    if not traj.id or not traj.id.strip():
        out.append(_finding("E201", "trajectory id is empty", **base))
    calls: dict[str, tuple[int, ToolCall]] = {}
    answered: dict[str, int] = {}
    declared = {t.name for t in traj.tools}
    for i, m in enumerate(traj.messages):
        loc = {**base, "message_index": i}
        why = _content_ok(m)
        if why:
            out.append(_finding("E204", why, **loc))
        if m.tool_calls is not None and m.role != "assistant":
            out.append(_finding("E205", f"{m.role} message has tool_calls", **loc))
        if m.tool_call_id is not None and m.role != "tool":
            out.append(_finding("E206", f"{m.role} message has tool_call_id", **loc))
        if (m.thought is not None or m.reasoning_content is not None) and m.role != "assistant":
            out.append(_finding("E207", f"{m.role} message has thought/reasoning_content", **loc))
        if m.train is True and m.role != "assistant":
            out.append(_finding("W250", f"train=true on a {m.role} message", **loc))
        if isinstance(m.content, list):
            for j, p in enumerate(m.content):
                if isinstance(p, ImagePart) and (p.url is None) == (p.path is None):
                    out.append(_finding("E231", f"content[{j}]: image part has {'both' if p.url else 'neither'} url and path", **loc))
        if m.role == "assistant":
            text = m.text() + (m.reasoning_content or "")
            if text.count("<think>") != text.count("</think>"):
                out.append(_finding("W251", f"{text.count('<think>')} <think> vs {text.count('</think>')} </think>", **loc))
        for c in m.tool_calls or []:
            if c.id in calls:
                out.append(_finding("E210", f"call id {c.id!r} already used at messages[{calls[c.id][0]}]", **loc))
            else:
                calls[c.id] = (i, c)
            _check_arguments(c, traj, loc, out)
            if declared and c.code is None and c.name not in declared and not _is_finish(c.name):
                out.append(_finding("W224", f"call {c.id}: tool {c.name!r} is not declared in tools", **loc))
        if m.role == "tool":
            if m.tool_call_id is None:
                out.append(_finding("E211", "tool message has no tool_call_id", **loc))
            elif m.tool_call_id not in calls:
                out.append(_finding("E211", f"tool_call_id {m.tool_call_id!r} matches no earlier call", **loc))
            elif m.tool_call_id in answered:
                out.append(_finding("E214", f"call {m.tool_call_id!r} already answered at messages[{answered[m.tool_call_id]}]", **loc))
            else:
                answered[m.tool_call_id] = i
    _unanswered_calls(traj, calls, answered, base, out)
    # order: results right after their assistant message, in call order
    for i, m in enumerate(traj.messages):
        if m.role != "assistant" or not m.tool_calls:
            continue
        expected = [c.id for c in m.tool_calls if c.id in answered and calls.get(c.id, (None,))[0] == i]
        run: list[str | None] = []
        j = i + 1
        while j < len(traj.messages) and traj.messages[j].role == "tool":
            run.append(traj.messages[j].tool_call_id)
            j += 1
        if run[:len(expected)] != expected:
            sev = "E" if export_format == "openai" else "W"
            out.append(_finding("W215", f"results {run} do not follow the calls {expected} in order", severity=sev,
                                **{**base, "message_index": i}))
    if sft and not traj.messages:
        out.append(_finding("W252", "trajectory has no messages", **base))
    elif sft and traj.messages[-1].role != "assistant":
        out.append(_finding("W252", f"last message is {traj.messages[-1].role}", **{**base, "message_index": len(traj.messages) - 1}))
    return out


def _folded_findings(traj: Trajectory, **kwargs: Any) -> list[Finding]:
    """A folded record (context folding, ``trajtune.folding``) answers each branch call twice by
    design, once in the branch and once with the summary in the folded context: each row it trains
    as is a conversation of its own, so each row is checked, and findings point at the record's
    messages (each once)."""
    out: list[Finding] = []
    seen: set[tuple[str, int | None, str]] = set()
    for row, index in expand_folds_indexed(traj):
        for f in validate_trajectory(row, **kwargs):
            if f.message_index is not None:
                f.message_index = index[f.message_index]
            key = (f.rule, f.message_index, f.message)
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out


def _unanswered_calls(traj: Trajectory, calls: dict[str, tuple[int, ToolCall]], answered: dict[str, int],
                      base: dict[str, Any], out: list[Finding]) -> None:
    """E212 only where a result is missing in the middle of a trajectory.

    A trajectory that *ends* on an assistant turn with calls (user -> assistant calls, the shape
    of every single-turn function-calling dataset: xLAM-60k, Glaive, APIGen, BFCL ground truth;
    also agent logs cut at their last action) is complete: the calls are what the model learns
    to emit and no result can follow. A finish-style call in the last assistant turn keeps its
    documented W213 note; other calls in the final message need no finding at all.
    """
    last_assistant = max((i for i, m in enumerate(traj.messages) if m.role == "assistant"), default=-1)
    last = len(traj.messages) - 1
    for cid, (i, c) in calls.items():
        if cid in answered:
            continue
        loc = {**base, "message_index": i}
        if i == last_assistant and _is_finish(c.name):
            out.append(_finding("W213", f"final call {c.name!r} ({cid}) has no result", **loc))
        elif i != last:
            out.append(_finding("E212", f"call {cid} ({c.name}) has no tool result", **loc))


# --------------------------------------------------------------------------- raw IR pre-checks


def _ir_precheck(obj: dict[str, Any], loc: dict[str, Any]) -> list[Finding]:
    """Rules pydantic would report as a generic schema error; checked first for precise rule ids."""
    out: list[Finding] = []
    rid = obj.get("id")
    if not isinstance(rid, str) or not rid.strip():
        out.append(_finding("E201", f"id is {rid!r}", **loc))
    sv = obj.get("schema_version", "1.0")
    if sv not in SUPPORTED_SCHEMA_VERSIONS:
        out.append(_finding("E202", f"schema_version {sv!r} not supported", **loc))
    msgs = obj.get("messages")
    if isinstance(msgs, list):
        for i, m in enumerate(msgs):
            if not isinstance(m, dict):
                continue
            if m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
                out.append(_finding("E203", f"role {m.get('role')!r} is not valid", **{**loc, "message_index": i}))
            c = m.get("content")
            if c is not None and not isinstance(c, (str, list)):
                out.append(_finding("E204", f"content is a {type(c).__name__}", **{**loc, "message_index": i}))
    return out


# --------------------------------------------------------------------------- files


def iter_findings(path: str | os.PathLike[str], format: str | None = None, *, export_format: str | None = None,
                  sft: bool = True, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
                  stats: dict[str, int] | None = None) -> Iterator[Finding]:
    """Stream every finding of a file, line by line (bounded memory)."""
    file = str(path)
    stats = stats if stats is not None else {}
    stats.setdefault("records", 0)
    stats.setdefault("valid", 0)
    fmt_name = format
    fmt = get_format(format) if format else None
    seen = False
    ids = DuplicateIds()
    for ln in iter_json_lines(path, max_line_bytes=max_line_bytes):
        loc: dict[str, Any] = {"file": file, "line": ln.lineno}
        if ln.bom:
            yield _finding("W108", "UTF-8 BOM at start of file (ignored)", **loc)
        if is_blank(ln):
            continue
        seen = True
        stats["records"] += 1
        if ln.problem is not None:
            yield _finding(ln.problem.rule, ln.problem.message, hint=ln.problem.hint, **loc)
            continue
        obj = ln.value
        if not isinstance(obj, dict):
            yield _finding("E105", f"record is a JSON {type(obj).__name__}", **loc)
            continue
        rid = obj.get("id", obj.get("unique_trajectory_id"))
        loc["trajectory_id"] = str(rid) if isinstance(rid, (str, int)) and not isinstance(rid, bool) else None
        bad = find_surrogates(obj) if ln.maybe_surrogate else []
        for p in bad:
            yield _finding("E240", f"lone surrogate in {p}", **loc)
        if fmt is None:
            try:
                fmt_name = detect_format(obj)
            except FormatDetectionError as e:
                yield _finding("E107", str(e), **loc)
                continue
            fmt = get_format(fmt_name)
        if fmt_name in ("ir", "trajtune"):
            pre = _ir_precheck(obj, loc)
            if pre:
                yield from pre
                continue
        try:
            traj, rep = fmt.to_ir(obj, line=ln.lineno)
        except ConversionError as e:
            yield _finding(e.rule if e.rule in RULES else "E110", e.message, hint=e.hint, **loc)
            continue
        except RecordError as e:
            yield _finding("E111", e.message, hint=e.hint, **loc)
            continue
        except ValidationError as e:
            first = e.errors()[0]
            yield _finding("E111", f"{'.'.join(str(x) for x in first['loc'])}: {first['msg']}", **loc)
            continue
        except (TypeError, AttributeError, KeyError, IndexError, ValueError, RecursionError) as e:  # converter bug: still locate it
            yield _finding("E110", f"converter {fmt_name} failed: {type(e).__name__}: {e}",
                           hint="this record has an unexpected shape; please report it", **loc)
            continue
        for w in rep.warnings:
            yield _finding("W109", w, **loc)
        deep = too_deep(traj, ln, file)
        if deep is not None:
            yield _finding("E112", deep.message, hint=deep.hint, **loc)
            continue
        found = validate_trajectory(traj, file=file, line=ln.lineno, export_format=export_format, sft=sft,
                                    check_strings=False)
        first = ids.earlier(traj.id, ln.lineno)
        if first is not None:
            found.append(_finding("W208", f"id {traj.id!r} was first used on line {first}", **loc))
        if not bad and not any(f.severity == "E" for f in found):
            stats["valid"] += 1
        yield from found
    if not seen:
        yield _finding("E104", "no records in file", file=file)


class DuplicateIds:
    """First line of each trajectory id seen in one file (8 bytes of hash per id: bounded memory)."""

    def __init__(self) -> None:
        self.first: dict[bytes, int] = {}

    def earlier(self, traj_id: str, line: int) -> int | None:
        """The line that used ``traj_id`` first, or None when this is its first use (now recorded)."""
        key = hashlib.blake2b(traj_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        first = self.first.get(key)
        if first is None:
            self.first[key] = line
        return first


class RecordCheck:
    """The validation rules as an ``iter_records(check=...)`` hook: the first error (E) finding of a
    record as a :class:`RecordError` (file:line, record id, rule, message index, hint), or None.

    Used by every command that reads data to produce something (convert, mix, split, dedup, sft),
    so none of them accepts a record that ``trajtune data validate`` rejects. Warnings pass, and are
    counted per rule in ``warnings`` (records affected), so a command can say what ``validate`` would."""

    def __init__(self, path: str | os.PathLike[str], *, sft: bool = True, export_format: str | None = None):
        self.path, self.sft, self.export_format = path, sft, export_format
        self.warnings: Counter[str] = Counter()
        self._ids = DuplicateIds()

    def __call__(self, traj: Trajectory, line: int) -> RecordError | None:
        found = validate_trajectory(traj, file=str(self.path), line=line, export_format=self.export_format,
                                    sft=self.sft)
        errors = [f for f in found if f.severity == "E"]
        if not errors:
            for rule in {f.rule for f in found if f.severity == "W"}:
                self.warnings[rule] += 1
            if self._ids.earlier(traj.id, line) is not None:
                self.warnings["W208"] += 1
            return None
        f = errors[0]
        where = f"messages[{f.message_index}]: " if f.message_index is not None else ""
        more = f" (+{len(errors) - 1} more error(s) in this record)" if len(errors) > 1 else ""
        return RecordError(self.path, line, f"{f.name}: {where}{f.message}{more}", rule=f.rule, record_id=traj.id,
                           hint=f.hint)

    def summary(self) -> str | None:
        """``W222 arguments-double-encoded: 3, …`` (records affected), or None without warnings."""
        if not self.warnings:
            return None
        return ", ".join(f"{r} {RULES[r].name}: {n}" for r, n in sorted(self.warnings.items()))


record_check = RecordCheck  # the name every reader calls


def validate_file(path: str | os.PathLike[str], format: str | None = None, **kw: Any) -> list[Finding]:
    """All findings of one file (see :func:`iter_findings` for the streaming form)."""
    return list(iter_findings(path, format, **kw))


def has_errors(findings: list[Finding], strict: bool = False) -> bool:
    return any(f.severity == "E" or (strict and f.severity == "W") for f in findings)


__all__ = ["BUILTIN_TOOLS", "DuplicateIds", "Finding", "RULES", "RecordCheck", "Rule", "has_errors",
           "iter_findings", "record_check",
           "schema_violations", "validate_file", "validate_trajectory"]
