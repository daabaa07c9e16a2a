"""OpenAI chat JSONL <-> IR.

The round trip OpenAI -> IR -> OpenAI is identity up to canonical JSON, so everything the IR has
no field for (unknown keys, null-vs-absent, legacy ``function_call``, the original argument
string) is parked under ``extra["openai"]`` and restored on export.
"""

from __future__ import annotations

import json
from typing import Any

from trajtune.formats._base import (
    ConversionError,
    ConversionReport,
    arguments_text,
    expect_object,
    foreign_extra_losses,
    ns,
    parse_arguments,
    restore_record_id,
    take_record_id,
)
from trajtune.schema import (
    ImagePart,
    JsonPart,
    Message,
    PassthroughPart,
    Provenance,
    TextPart,
    ToolCall,
    ToolSpec,
    Trajectory,
    WebPart,
    generate_call_ids,
)

NAME = "openai"
_MSG_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "function_call", "reasoning_content", "weight"}
_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def detect(record: Any) -> float:
    """Confidence that ``record`` is OpenAI chat: a ``messages`` list of role/content dicts."""
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        return 0.0
    msgs = record["messages"]
    if not msgs:
        return 0.8  # an empty conversation: still the OpenAI shape (the validator reports it)
    if not all(isinstance(m, dict) and "role" in m for m in msgs):
        return 0.1
    return 0.9


# ------------------------------------------------------------------------------------- import


def _part_to_ir(part: Any) -> Any:
    if isinstance(part, dict):
        t = part.get("type")
        if t == "text" and set(part) == {"type", "text"} and isinstance(part["text"], str):
            return TextPart(text=part["text"])
        if t == "image_url" and set(part) == {"type", "image_url"} and isinstance(part["image_url"], dict):
            iu = part["image_url"]
            if set(iu) <= {"url", "detail"} and isinstance(iu.get("url"), str) and isinstance(iu.get("detail", ""), str):
                return ImagePart(url=iu["url"], detail=iu.get("detail"))
        return PassthroughPart(source_type=t if isinstance(t, str) else None, raw=part)
    return PassthroughPart(source_type=None, raw=part)


def _call_to_ir(c: Any, where: str) -> ToolCall:
    if not isinstance(c, dict):
        raise ConversionError(f"{where}: a tool call must be an object, got {type(c).__name__}",
                              hint='use {"id": ..., "type": "function", "function": {"name": ..., "arguments": "{...}"}}')
    flags: dict[str, Any] = {}
    cid = c.get("id")
    if "id" not in c:
        flags["id_src"] = "absent"
    elif cid is None:
        flags["id_src"] = "null"
    elif cid == "":
        flags["id_src"] = "empty"
    elif not isinstance(cid, str):
        raise ConversionError(f"{where}: tool call id must be a string, got {type(cid).__name__}")
    if "type" not in c:
        flags["type_absent"] = True
    ctype = c.get("type", "function")
    extra_keys = {k: v for k, v in c.items() if k not in {"id", "type", "function", "custom"}}
    if extra_keys:
        flags["keys"] = extra_keys
    if ctype == "custom":
        cu = c.get("custom")
        if not isinstance(cu, dict) or not isinstance(cu.get("name"), str):
            raise ConversionError(f"{where}: custom tool call needs custom.name")
        if set(cu) - {"name", "input"}:
            flags["custom_keys"] = {k: v for k, v in cu.items() if k not in {"name", "input"}}
        inp = cu.get("input")
        return ToolCall(id=cid or "", type="custom", name=cu["name"], input=inp if isinstance(inp, str) else None,
                        extra={"openai": flags} if flags else {})
    fn = c.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ConversionError(f"{where}: tool call needs function.name (a string)",
                              hint='use {"function": {"name": "...", "arguments": "{...}"}}')
    if ctype != "function":
        flags["type"] = ctype
    if set(fn) - {"name", "arguments"}:
        flags["function_keys"] = {k: v for k, v in fn.items() if k not in {"name", "arguments"}}
    if "arguments" not in fn:
        flags["arguments_absent"] = True
    elif isinstance(fn["arguments"], dict):
        flags["arguments_dict"] = True
    args, raw = parse_arguments(fn.get("arguments"))
    if fn.get("arguments") is not None and not isinstance(fn.get("arguments"), (str, dict)):
        flags["arguments_value"] = fn["arguments"]
    return ToolCall(id=cid or "", type="function", name=fn["name"], arguments=args, arguments_raw=raw,
                    extra={"openai": flags} if flags else {})


def _tool_to_ir(spec: Any, legacy: bool) -> ToolSpec:
    if not isinstance(spec, dict):
        raise ConversionError(f"tools: each tool must be an object, got {type(spec).__name__}")
    fn = spec if legacy else spec.get("function")
    if isinstance(fn, dict) and isinstance(fn.get("name"), str):
        params = fn.get("parameters")
        strict = fn.get("strict")
        return ToolSpec(type="function", name=fn["name"],
                        description=fn.get("description") if isinstance(fn.get("description"), str) else "",
                        parameters=params if isinstance(params, dict) else {"type": "object", "properties": {}},
                        strict=strict if isinstance(strict, bool) else None, raw=spec,
                        extra={"openai": {"verbatim": True}})
    t = spec.get("type")
    name = spec.get("name") if isinstance(spec.get("name"), str) else (t if isinstance(t, str) else "tool")
    return ToolSpec(type=t if isinstance(t, str) else "function", name=name, raw=spec, extra={"openai": {"verbatim": True}})


def to_ir(record: Any, *, line: int | None = None) -> tuple[Trajectory, ConversionReport]:
    report = ConversionReport(source_format=NAME, target_format="ir")
    expect_object(record)
    msgs_in = record.get("messages")
    if not isinstance(msgs_in, list):
        raise ConversionError("missing 'messages' list", hint="an OpenAI chat record is {\"messages\": [...], \"tools\": [...]}")
    textra: dict[str, Any] = {}
    tid = take_record_id(record, "openai", textra)
    top = {k: v for k, v in record.items() if k not in {"id", "messages", "tools", "functions", "metadata"}}
    if top:
        textra["top"] = top
    metadata = _record_metadata(record, textra)
    tools = _record_tools(record, textra)
    messages = [_message_to_ir(m, f"messages[{i}]") for i, m in enumerate(msgs_in)]

    traj = Trajectory(id=tid, messages=messages, tools=tools, metadata=metadata or {},
                      provenance=Provenance(source_format=NAME, record_id=tid if "id_absent" not in textra else None,
                                            converter="trajtune.formats.openai"),
                      extra={"openai": textra} if textra else {})
    generate_call_ids(traj)
    _pair_missing_tool_call_ids(traj, report)
    return traj, report


def _record_metadata(record: dict[str, Any], textra: dict[str, Any]) -> dict[str, Any] | None:
    """The record's ``metadata`` when it is a dict; a non-dict one, or an empty one, is noted in
    ``textra`` so that export writes back exactly what came in."""
    metadata = record.get("metadata")
    if "metadata" in record and not isinstance(metadata, dict):
        textra.setdefault("top", {})["metadata"] = metadata
        metadata = None
    elif isinstance(metadata, dict) and not metadata:
        textra["metadata_empty"] = True
    return metadata


def _record_tools(record: dict[str, Any], textra: dict[str, Any]) -> list[ToolSpec]:
    """``tools`` and the legacy ``functions`` list, in that order, each spec marked with where it came from."""
    tools: list[ToolSpec] = []
    for key, legacy in (("tools", False), ("functions", True)):
        if key in record:
            if not isinstance(record[key], list):
                raise ConversionError(f"'{key}' must be a list, got {type(record[key]).__name__}",
                                      hint="OpenAI tools are a JSON list, not a JSON string")
            textra[f"{key}_present"] = True
            for spec in record[key]:
                ts = _tool_to_ir(spec, legacy)
                if legacy:
                    ts.extra["openai"]["legacy"] = True
                tools.append(ts)
    return tools


def _message_to_ir(m: Any, where: str) -> Message:
    """One OpenAI message -> one IR message. ``mx`` collects what the IR has no field for (unknown
    keys, absent versus null, legacy spellings) so export restores the message as it was."""
    expect_object(m, where)
    role = m.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise ConversionError(f"{where}: invalid role {role!r}", rule="E203",
                              hint="roles are system, developer, user, assistant, tool (or legacy function)")
    mx: dict[str, Any] = {}
    keys = {k: v for k, v in m.items() if k not in _MSG_KEYS}
    if keys:
        mx["keys"] = keys
    content = _message_content(m, where, mx)
    name = m.get("name")
    if name is not None and not isinstance(name, str):
        raise ConversionError(f"{where}: name must be a string", rule="E111")
    train = _message_weight(m, mx)
    rc = _message_reasoning(m, mx)
    tool_calls = _message_calls(m, where, mx)
    tcid = m.get("tool_call_id")
    if tcid is not None and not isinstance(tcid, str):
        raise ConversionError(f"{where}: tool_call_id must be a string", rule="E111")
    ir_role = _message_role(m, role, tcid, mx)
    return Message(role=ir_role, content=content, name=name, reasoning_content=rc, tool_calls=tool_calls,
                   tool_call_id=tcid, train=train, extra={"openai": mx} if mx else {})


def _message_content(m: dict[str, Any], where: str, mx: dict[str, Any]) -> Any:
    """Text, null, or a list of parts; an absent ``content`` is told apart from a null one."""
    if "content" not in m:
        mx["content_absent"] = True
        return None
    c = m["content"]
    if c is None or isinstance(c, str):
        return c
    if isinstance(c, list):
        return [_part_to_ir(p) for p in c]
    raise ConversionError(f"{where}: content must be a string, a list of parts or null, got {type(c).__name__}",
                          rule="E204")


def _message_weight(m: dict[str, Any], mx: dict[str, Any]) -> bool | None:
    """A ``weight`` of 0 or 1 says whether to train on the message; any other value is kept as a key."""
    if "weight" not in m:
        return None
    if m["weight"] in (0, 1) and not isinstance(m["weight"], bool):
        return bool(m["weight"])
    mx.setdefault("keys", {})["weight"] = m["weight"]
    return None


def _message_reasoning(m: dict[str, Any], mx: dict[str, Any]) -> str | None:
    """``reasoning_content`` when it is text; anything else is kept as a key, and null is remembered."""
    rc = m.get("reasoning_content")
    if rc is not None and not isinstance(rc, str):
        mx.setdefault("keys", {})["reasoning_content"] = rc
        return None
    if "reasoning_content" in m and rc is None:
        mx["reasoning_null"] = True
    return rc


def _message_calls(m: dict[str, Any], where: str, mx: dict[str, Any]) -> list[ToolCall] | None:
    """``tool_calls`` followed by the legacy ``function_call``, which becomes one more call."""
    tool_calls = None
    if "tool_calls" in m:
        tc = m["tool_calls"]
        if tc is None:
            mx["tool_calls_null"] = True
        elif not isinstance(tc, list):
            raise ConversionError(f"{where}: tool_calls must be a list", rule="E111")
        else:
            tool_calls = [_call_to_ir(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(tc)]
    if "function_call" in m:
        fc = m["function_call"]
        if fc is None:
            mx["function_call_null"] = True
        else:
            call = _call_to_ir({"function": fc}, f"{where}.function_call")
            call.extra.setdefault("openai", {}).update({"legacy": True})
            call.extra["openai"].pop("id_src", None)
            call.extra["openai"].pop("type_absent", None)
            tool_calls = (tool_calls or []) + [call]
    return tool_calls


def _message_role(m: dict[str, Any], role: str, tcid: str | None, mx: dict[str, Any]) -> str:
    """The IR role: the legacy ``function`` role is a tool result; how ``tool_call_id`` was missing is noted."""
    if role == "function":
        mx["legacy_function"] = True
        return "tool"
    if role == "tool" and "tool_call_id" not in m:
        mx["tool_call_id_absent"] = True
    elif "tool_call_id" in m and tcid is None:
        mx["tool_call_id_null"] = True
    return role


def _pair_missing_tool_call_ids(traj: Trajectory, report: ConversionReport) -> None:
    """Give id-less tool results the id of the next unanswered call, in order (legacy and id-less data)."""
    pending: list[ToolCall] = []
    for m in traj.messages:
        if m.role == "assistant" and m.tool_calls:
            answered = {x.tool_call_id for x in traj.messages if x.tool_call_id}
            pending = [c for c in m.tool_calls if c.id not in answered]
        elif m.role == "tool":
            if m.tool_call_id is None:
                if pending:
                    call = pending.pop(0)
                    m.tool_call_id = call.id
                    m.extra.setdefault("openai", {})["tool_call_id_paired"] = True
                    if not call.id_generated:
                        report.warn(f"tool result without tool_call_id paired with call {call.id} by position")
            else:
                pending = [c for c in pending if c.id != m.tool_call_id]


# ------------------------------------------------------------------------------------- export


def _part_from_ir(p: Any, report: ConversionReport) -> Any:
    if isinstance(p, TextPart):
        return {"type": "text", "text": p.text}
    if isinstance(p, ImagePart):
        if p.url is not None:
            iu: dict[str, Any] = {"url": p.url}
            if p.detail is not None:
                iu["detail"] = p.detail
            if p.media_type is not None and not p.url.startswith("data:"):
                report.lose("image_media_type")
            return {"type": "image_url", "image_url": iu}
        report.lose("image_path")
        return {"type": "image_url", "image_url": {"url": f"file://{p.path}"}}
    if isinstance(p, WebPart):
        report.lose("web_observation")
        body = p.axtree if p.axtree is not None else (p.html or "")
        head = f"URL: {p.url}\n" if p.url else ""
        return {"type": "text", "text": head + body}
    if isinstance(p, JsonPart):
        report.lose("json_part")
        return {"type": "text", "text": json.dumps(p.data, ensure_ascii=False)}
    if isinstance(p, PassthroughPart):
        if isinstance(p.raw, dict) and p.raw.get("type") == p.source_type:
            return p.raw
        report.lose("passthrough_part")
        return {"type": "text", "text": str(p.raw)}
    raise TypeError(p)


def _call_from_ir(c: ToolCall, report: ConversionReport) -> dict[str, Any]:
    f = ns(c.extra, "openai")
    foreign_extra_losses(c.extra, "openai", report)
    if c.code is not None:
        report.lose("code_action")
    if c.type == "custom":
        custom: dict[str, Any] = {"name": c.name}
        if c.input is not None:
            custom["input"] = c.input
        custom.update(f.get("custom_keys", {}))
        out: dict[str, Any] = {"type": "custom", "custom": custom}
    else:
        fn: dict[str, Any] = {"name": c.name}
        if "arguments_value" in f:
            fn["arguments"] = f["arguments_value"]
        elif f.get("arguments_dict") and c.arguments is not None:
            fn["arguments"] = c.arguments
        elif not f.get("arguments_absent"):
            if c.arguments is None and c.arguments_raw is None and c.code is not None:
                fn["arguments"] = json.dumps({"code": c.code.source, "language": c.code.language}, ensure_ascii=False)
            elif c.arguments is None and c.arguments_raw is None and c.input is not None:
                fn["arguments"] = c.input
            else:
                fn["arguments"] = arguments_text(c.arguments, c.arguments_raw)
        fn.update(f.get("function_keys", {}))
        out = {"type": f.get("type", "function"), "function": fn}
    if f.get("legacy"):
        return out["function"]
    if f.get("type_absent"):
        out.pop("type")
    src = f.get("id_src")
    if c.id_generated and src == "absent":
        pass
    elif c.id_generated and src == "null":
        out["id"] = None
    elif c.id_generated and src == "empty":
        out["id"] = ""
    else:
        out["id"] = c.id
    out.update(f.get("keys", {}))
    return out


def from_ir(traj: Trajectory) -> tuple[dict[str, Any], ConversionReport]:
    report = ConversionReport(source_format="ir", target_format=NAME)
    tx = ns(traj.extra, "openai")
    foreign_extra_losses(traj.extra, "openai", report)
    rec: dict[str, Any] = restore_record_id(tx, traj.id)
    messages: list[dict[str, Any]] = []
    for m in traj.messages:
        mx = ns(m.extra, "openai")
        foreign_extra_losses(m.extra, "openai", report)
        out: dict[str, Any] = {"role": "function" if mx.get("legacy_function") else m.role}
        if m.name is not None:
            out["name"] = m.name
        if not (mx.get("content_absent") and m.content is None):
            if isinstance(m.content, list):
                out["content"] = [_part_from_ir(p, report) for p in m.content]
            else:
                out["content"] = m.content
        if m.thought is not None:
            report.lose("thought")
        if m.reasoning_content is not None:
            out["reasoning_content"] = m.reasoning_content
        elif mx.get("reasoning_null"):
            out["reasoning_content"] = None
        if m.origin is not None and m.role == "user" and m.origin != "user":
            report.lose("observation_source")
        if m.reward is not None:
            report.lose("message_reward")
        if m.train is not None:
            if m.role == "assistant":
                out["weight"] = 1 if m.train else 0
            else:
                report.lose("train_flags")
        if m.tool_calls is not None:
            calls = [c for c in m.tool_calls if not ns(c.extra, "openai").get("legacy")]
            legacy = [c for c in m.tool_calls if ns(c.extra, "openai").get("legacy")]
            if calls or not legacy:
                out["tool_calls"] = [_call_from_ir(c, report) for c in calls]
            for c in legacy:
                out["function_call"] = _call_from_ir(c, report)
        if mx.get("tool_calls_null"):
            out["tool_calls"] = None
        if mx.get("function_call_null"):
            out["function_call"] = None
        if m.tool_call_id is not None and not mx.get("legacy_function") and not mx.get("tool_call_id_absent"):
            out["tool_call_id"] = m.tool_call_id
        elif mx.get("tool_call_id_null"):
            out["tool_call_id"] = None
        out.update(mx.get("keys", {}))
        messages.append(out)
    rec["messages"] = messages
    tools = [t for t in traj.tools if not ns(t.extra, "openai").get("legacy")]
    legacy_tools = [t for t in traj.tools if ns(t.extra, "openai").get("legacy")]
    if tools or tx.get("tools_present") or (not tx and traj.tools):
        rec["tools"] = [t.raw if (t.raw is not None and ns(t.extra, "openai").get("verbatim")) else t.to_openai()
                        for t in tools]
    if legacy_tools or (tx.get("functions_present")):
        rec["functions"] = [t.raw for t in legacy_tools]
    if traj.metadata or tx.get("metadata_empty"):
        rec["metadata"] = traj.metadata
    for field, token in (("reward", "reward"), ("outcome", "outcome"), ("reference", "reference")):
        if getattr(traj, field) is not None:
            report.lose(token)
    rec.update(tx.get("top", {}))
    return rec, report
