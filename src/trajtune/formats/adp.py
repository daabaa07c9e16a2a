"""Agent Data Protocol (ADP) v1 and 1.x <-> IR.

ADP is a flat list of actions and observations. Each ADP item becomes exactly one IR message, with
its ``class_`` and any unmapped keys under ``extra["adp"]``, so ADP -> IR -> ADP is identity up to
canonical JSON. v1 has no call ids: observations answer calls by position, so ids are generated
(``call_000000``...) and dropped again on export.
"""

from __future__ import annotations

import json
from typing import Any

from trajtune.formats._base import (
    ConversionError,
    ConversionReport,
    arguments_dict,
    expect_object,
    foreign_extra_losses,
    ns,
    restore_record_id,
    take_record_id,
)
from trajtune.formats.openai import _tool_to_ir
from trajtune.schema import (
    CodeAction,
    ImagePart,
    JsonPart,
    Message,
    Provenance,
    TextPart,
    ToolCall,
    Trajectory,
    WebPart,
    generate_call_ids,
)

NAME = "adp"
DEFAULT_VERSION = "1.2.0"
_ACTIONS = {"api_action", "code_action", "message_action"}
_OBS = {"text_observation", "image_observation", "web_observation"}
_MAPPED = {
    "api_action": {"class_", "function", "kwargs", "description", "tool_call_id", "reasoning_content", "reward"},
    "code_action": {"class_", "language", "content", "description", "tool_call_id", "reasoning_content", "reward"},
    "message_action": {"class_", "content", "description", "reasoning_content", "reward"},
    "text_observation": {"class_", "content", "source", "name", "tool_call_id", "reward"},
    "image_observation": {"class_", "content", "source", "tool_call_id", "reward"},
    "web_observation": {"class_", "html", "axtree", "url", "viewport_size", "image_observation", "source", "tool_call_id", "reward"},
}


def detect(record: Any) -> float:
    if not isinstance(record, dict) or not isinstance(record.get("content"), list):
        return 0.0
    items = [x for x in record["content"] if isinstance(x, dict)]
    if items and all(x.get("class_") in _ACTIONS | _OBS for x in items):
        return 0.95
    return 0.2 if "details" in record else 0.0


def code_tool_name(language: str) -> str:
    """Name given to an ADP code action's call in the IR (``execute_python``...)."""
    return f"execute_{language}"


def _str_or_none(v: Any, where: str, field: str) -> str | None:
    if v is None or isinstance(v, str):
        return v
    raise ConversionError(f"{where}: {field} must be a string, got {type(v).__name__}", rule="E111")


def _num_or_none(v: Any, where: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConversionError(f"{where}: reward must be a number", rule="E111")
    return float(v)


def to_ir(record: Any, *, line: int | None = None) -> tuple[Trajectory, ConversionReport]:
    report = ConversionReport(source_format=NAME, target_format="ir")
    expect_object(record)
    items = record.get("content")
    if not isinstance(items, list):
        raise ConversionError("missing 'content' list of ADP actions/observations",
                              hint='an ADP record is {"id": ..., "content": [{"class_": "text_observation", ...}], "details": {}}')
    tx: dict[str, Any] = {}
    version = _schema_version(record, tx)
    tid = take_record_id(record, "adp", tx)
    details, reward = _record_fields(record, tx)
    tools = _record_tools(record)

    messages: list[Message] = []
    pending: list[ToolCall] = []
    needs_pairing: list[Message] = []
    for i, it in enumerate(items):
        messages.append(_item_to_message(it, f"content[{i}]", pending, needs_pairing))

    traj = Trajectory(id=tid, messages=messages, tools=tools, metadata=details or {}, reward=reward,
                      provenance=Provenance(source_format=NAME, source_version=version or "1",
                                            record_id=tid if "id_absent" not in tx else None,
                                            converter="trajtune.formats.adp"),
                      extra={"adp": tx} if tx else {})
    generate_call_ids(traj)
    _pair_by_position(needs_pairing, version, report)
    return traj, report


def _schema_version(record: dict[str, Any], tx: dict[str, Any]) -> str | None:
    """The record's ADP version; v1 has none, which is remembered so export writes none again."""
    version = record.get("schema_version")
    if version is not None:
        if not isinstance(version, str) or not version.startswith("1."):
            raise ConversionError(f"unsupported ADP schema_version {version!r}", rule="E202",
                                  hint="supported: ADP v1 (no schema_version) and 1.x ('1.0.0'..'1.2.0')")
        tx["schema_version"] = version
    else:
        tx["v1"] = True
    return version


def _record_fields(record: dict[str, Any], tx: dict[str, Any]) -> tuple[dict[str, Any] | None, float | None]:
    """``details`` and ``reward`` of the record; whatever the IR cannot hold (a non-dict ``details``, a
    non-numeric reward, unknown top-level keys) is kept in ``tx`` so export restores it exactly."""
    details = record.get("details")
    if "details" not in record:
        tx["details_absent"] = True
    elif not isinstance(details, dict):
        tx["details_value"] = details
        details = None
    top = {k: v for k, v in record.items() if k not in {"id", "content", "details", "schema_version", "tools", "reward"}}
    if top:
        tx["top"] = top
    reward = None
    if "reward" in record:
        if isinstance(record["reward"], (int, float)) and not isinstance(record["reward"], bool):
            reward = float(record["reward"])
            tx["reward_int"] = isinstance(record["reward"], int)
        else:
            tx.setdefault("top", {})["reward"] = record["reward"]
    return details, reward


def _record_tools(record: dict[str, Any]) -> list[Any]:
    """ADP 1.x tool specs are OpenAI-shaped, so the OpenAI reader parses them; their leftovers are
    filed under ``adp`` because that is the format they came from."""
    tools = []
    if "tools" in record:
        if not isinstance(record["tools"], list):
            raise ConversionError("'tools' must be a list of OpenAI-shaped tool specs", rule="E111")
        tools = [_tool_to_ir(s, False) for s in record["tools"]]
        for t in tools:
            t.extra["adp"] = t.extra.pop("openai")
    return tools


def _item_to_message(it: Any, where: str, pending: list[ToolCall], needs_pairing: list[Message]) -> Message:
    """One ADP item -> one IR message. ``pending`` holds the calls not answered yet (in order), which
    observations without a ``tool_call_id`` answer by position; those land in ``needs_pairing``."""
    expect_object(it, where)
    cls = it.get("class_")
    if not isinstance(cls, str) or cls not in _MAPPED:
        raise ConversionError(f"{where}: unknown class_ {cls!r}", rule="E111",
                              hint=f"ADP classes: {', '.join(sorted(_MAPPED))}")
    mx = _item_extra(it, cls)
    rwd = _num_or_none(it.get("reward"), where)
    if isinstance(it.get("reward"), int):
        mx["reward_int"] = True
    tcid = _str_or_none(it.get("tool_call_id"), where, "tool_call_id")
    if cls in _ACTIONS:
        return _action_message(it, cls, where, mx, rwd, tcid, pending)
    return _observation_message(it, cls, where, mx, rwd, tcid, pending, needs_pairing)


def _item_extra(it: dict[str, Any], cls: str) -> dict[str, Any]:
    """What export needs to write the item back byte-for-byte: its class, keys the IR has no field
    for, and which optional keys were absent or null (both read as None in the IR)."""
    mx: dict[str, Any] = {"class_": cls}
    keys = {k: v for k, v in it.items() if k not in _MAPPED[cls]}
    if keys:
        mx["keys"] = keys
    for k in ("description", "tool_call_id", "reasoning_content", "reward", "name", "source"):
        if k in _MAPPED[cls] and k not in it:
            mx.setdefault("absent", []).append(k)
        elif k in _MAPPED[cls] and it[k] is None:
            mx.setdefault("null", []).append(k)
    return mx


def _action_message(it: dict[str, Any], cls: str, where: str, mx: dict[str, Any], rwd: float | None,
                    tcid: str | None, pending: list[ToolCall]) -> Message:
    """An action is the agent's turn: an API call, a code call, or plain text."""
    thought = _str_or_none(it.get("description"), where, "description")
    rc = _str_or_none(it.get("reasoning_content"), where, "reasoning_content")
    msg = Message(role="assistant", origin="agent", thought=thought, reasoning_content=rc, reward=rwd,
                  extra={"adp": mx})
    if cls == "api_action":
        fn = it.get("function")
        if not isinstance(fn, str) or not fn:
            raise ConversionError(f"{where}: api_action needs a 'function' name", rule="E111")
        kw = it.get("kwargs")
        call = ToolCall(id=tcid or "", name=fn)
        if isinstance(kw, dict):
            call.arguments = kw
        else:
            mx["kwargs_value"] = kw
        msg.tool_calls = [call]
        pending.append(call)
    elif cls == "code_action":
        lang, src = it.get("language"), it.get("content")
        if not isinstance(lang, str) or not isinstance(src, str):
            raise ConversionError(f"{where}: code_action needs string 'language' and 'content'", rule="E230",
                                  hint='e.g. {"class_": "code_action", "language": "python", "content": "print(1)"}')
        call = ToolCall(id=tcid or "", name=code_tool_name(lang), arguments={"code": src},
                        code=CodeAction(language=lang, source=src))
        msg.tool_calls = [call]
        pending.append(call)
    else:
        c = it.get("content")
        if c is not None and not isinstance(c, str):
            raise ConversionError(f"{where}: message_action content must be a string", rule="E204")
        msg.content = c
    return msg


def _observation_message(it: dict[str, Any], cls: str, where: str, mx: dict[str, Any], rwd: float | None,
                         tcid: str | None, pending: list[ToolCall], needs_pairing: list[Message]) -> Message:
    """An observation's role follows its ``source``: the user's turn, the agent's own, or the
    environment's, which answers a call (by id, else the oldest pending one) or is a user turn."""
    source = it.get("source")
    if source is not None and source not in ("user", "agent", "environment"):
        mx["source_value"] = source
    name = _str_or_none(it.get("name"), where, "name")
    content = _observation_content(it, cls, where, mx)
    eff_source = source if source in ("user", "agent", "environment") else "environment"
    if eff_source == "user":
        return Message(role="user", origin="user", content=content, name=name, reward=rwd, extra={"adp": mx})
    if eff_source == "agent":
        return Message(role="assistant", origin="agent", content=content, name=name, reward=rwd, extra={"adp": mx})
    if tcid is not None:
        pending[:] = [c for c in pending if c.id != tcid]
        return Message(role="tool", origin="environment", content=content, name=name, tool_call_id=tcid,
                       reward=rwd, extra={"adp": mx})
    if pending:
        call = pending.pop(0)
        msg = Message(role="tool", origin="environment", content=content, name=name, reward=rwd, extra={"adp": mx})
        mx["paired"] = True
        needs_pairing.append(msg)
        msg.extra["adp"]["_call"] = call  # resolved to an id once ids are generated, in _pair_by_position
        return msg
    return Message(role="user", origin="environment", content=content, name=name, reward=rwd, extra={"adp": mx})


def _observation_content(it: dict[str, Any], cls: str, where: str, mx: dict[str, Any]) -> Any:
    """Text, an image, or a web page (with an optional screenshot) as IR content."""
    if cls == "text_observation":
        c = it.get("content")
        if c is not None and not isinstance(c, str):
            raise ConversionError(f"{where}: text_observation content must be a string", rule="E204")
        return c
    if cls == "image_observation":
        c = it.get("content")
        if not isinstance(c, str):
            raise ConversionError(f"{where}: image_observation content must be an image path", rule="E204")
        return [ImagePart(path=c)]
    vs = it.get("viewport_size")
    if vs is not None and not (isinstance(vs, list) and all(isinstance(x, int) for x in vs)):
        mx["viewport_value"] = vs
        vs = None
    content: list[Any] = [WebPart(url=_str_or_none(it.get("url"), where, "url"),
                                  html=_str_or_none(it.get("html"), where, "html"),
                                  axtree=_str_or_none(it.get("axtree"), where, "axtree"), viewport_size=vs)]
    for k in ("url", "html", "axtree", "viewport_size", "image_observation"):
        if k not in it:
            mx.setdefault("absent", []).append(k)
    io = it.get("image_observation")
    if isinstance(io, dict) and isinstance(io.get("content"), str):
        content.append(ImagePart(path=io["content"]))
        mx["image_observation"] = {k: v for k, v in io.items() if k != "content"}
    elif io is not None:
        mx["image_observation_value"] = io
    return content


def _pair_by_position(needs_pairing: list[Message], version: str | None, report: ConversionReport) -> None:
    """Give observations answered by position the id of their call, now that ids exist. In 1.x, where
    ids are expected, pairing by position is a guess worth a warning."""
    for m in needs_pairing:
        call = m.extra["adp"].pop("_call")
        m.tool_call_id = call.id
        if not call.id_generated and version is not None:
            report.warn(f"observation without tool_call_id paired with call {call.id} by position")


# ------------------------------------------------------------------------------------- export


def _text_of(content: Any, report: ConversionReport) -> str | None:
    if content is None or isinstance(content, str):
        return content
    out = []
    for p in content:
        if isinstance(p, TextPart):
            out.append(p.text)
        elif isinstance(p, JsonPart):
            out.append(json.dumps(p.data, ensure_ascii=False))
            report.lose("json_part")
        else:
            report.lose(f"{p.type}_part")
    return "".join(out)


def _put_optional(item: dict[str, Any], mx: dict[str, Any], key: str, value: Any) -> None:
    """Restore absent/null/value for a key the way the source had it."""
    if value is not None:
        item[key] = value
    elif key in mx.get("null", []):
        item[key] = None


def _restore_reward(v: float | None, mx: dict[str, Any]) -> Any:
    if v is not None and mx.get("reward_int") and float(v).is_integer():
        return int(v)
    return v


def from_ir(traj: Trajectory, version: str | None = None) -> tuple[dict[str, Any], ConversionReport]:
    """Export to ADP. ``version`` "1" gives v1 (no ids); default keeps the source's or uses 1.2.0."""
    report = ConversionReport(source_format="ir", target_format=NAME)
    tx = ns(traj.extra, "adp")
    foreign_extra_losses(traj.extra, "adp", report)
    if version is None:
        version = "1" if tx.get("v1") else tx.get("schema_version", DEFAULT_VERSION)
    v1 = version == "1"
    rec: dict[str, Any] = restore_record_id(tx, traj.id)
    if not v1:
        rec["schema_version"] = version
    items: list[dict[str, Any]] = []
    for m in traj.messages:
        items.extend(_message_to_items(m, v1, report))
    rec["content"] = items
    if "details_value" in tx:
        rec["details"] = tx["details_value"]
    elif not tx.get("details_absent") or traj.metadata:
        rec["details"] = dict(traj.metadata)
    if traj.tools:
        if v1:
            report.lose("tools")
        else:
            rec["tools"] = [t.raw if (t.raw is not None and (ns(t.extra, "adp").get("verbatim") or ns(t.extra, "openai").get("verbatim")))
                            else t.to_openai() for t in traj.tools]
    if traj.reward is not None:
        if v1:
            report.lose("reward")
        else:
            rec["reward"] = int(traj.reward) if tx.get("reward_int") and traj.reward.is_integer() else traj.reward
    for field in ("outcome", "reference"):
        if getattr(traj, field) is not None:
            report.lose(field)
    rec.update(tx.get("top", {}))
    return rec, report


def _message_to_items(m: Message, v1: bool, report: ConversionReport) -> list[dict[str, Any]]:
    mx = ns(m.extra, "adp")
    foreign_extra_losses(m.extra, "adp", report)
    if m.train is not None:
        report.lose("train_flags")
    if m.name is not None and m.role in ("assistant", "system", "developer"):
        report.lose("name")
    cls = mx.get("class_")
    reward = _restore_reward(m.reward, mx)
    if reward is not None and v1:
        report.lose("reward")
        reward = None
    if m.role == "assistant" and (m.tool_calls or cls in _ACTIONS or cls is None):
        return _assistant_items(m, mx, v1, reward, report)
    # observations (and system prompts, which ADP cannot express)
    if m.role in ("system", "developer"):
        report.lose("system_role")
        source = "user"
    elif m.role == "user":
        source = "environment" if m.origin == "environment" else ("agent" if m.origin == "agent" else "user")
    elif m.role == "tool":
        source = "environment"
    else:
        source = "agent"
    if "source_value" in mx:
        source = mx["source_value"]
    item: dict[str, Any]
    parts = m.content if isinstance(m.content, list) else None
    if cls == "web_observation" or (cls is None and parts and any(isinstance(p, WebPart) for p in parts)):
        web = next((p for p in parts or [] if isinstance(p, WebPart)), WebPart())
        img = next((p for p in parts or [] if isinstance(p, ImagePart)), None)
        item = {"class_": "web_observation"}
        absent = set(mx.get("absent", []))
        for k in ("html", "axtree", "url"):
            if not (k in absent and getattr(web, k) is None):
                item[k] = getattr(web, k)
        if "viewport_value" in mx:
            item["viewport_size"] = mx["viewport_value"]
        elif not ("viewport_size" in absent and web.viewport_size is None):
            item["viewport_size"] = web.viewport_size
        if img is not None:
            item["image_observation"] = {**mx.get("image_observation", {"class_": "image_observation"}), "content": img.path or img.url}
        elif "image_observation_value" in mx:
            item["image_observation"] = mx["image_observation_value"]
        elif "image_observation" not in absent:
            item["image_observation"] = None
        if parts and len(parts) > 1 + (img is not None):
            report.lose("extra_content_parts")
    elif cls == "image_observation" or (cls is None and parts and all(isinstance(p, ImagePart) for p in parts)):
        img = next(p for p in parts or [] if isinstance(p, ImagePart)) if parts else None
        item = {"class_": "image_observation", "content": (img.path or img.url) if img else None}
        if parts and len(parts) > 1:
            report.lose("extra_content_parts")
    else:
        item = {"class_": "text_observation", "content": _text_of(m.content, report)}
        _put_optional(item, mx, "name", m.name)
    if not ("source" in mx.get("absent", []) and source == "environment"):
        item["source"] = source
    if m.tool_call_id is not None and not mx.get("paired"):
        if v1:
            report.lose("call_ids")
        else:
            item["tool_call_id"] = m.tool_call_id
    elif "tool_call_id" in mx.get("null", []):
        item["tool_call_id"] = None
    _put_optional(item, mx, "reward", reward)
    item.update(mx.get("keys", {}))
    return [item]


def _assistant_items(m: Message, mx: dict[str, Any], v1: bool, reward: Any, report: ConversionReport) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    thought_used = False

    def common(item: dict[str, Any], with_desc: bool = True) -> None:
        nonlocal thought_used
        if with_desc:
            if not thought_used and m.thought is not None:
                item["description"] = m.thought
                thought_used = True
            elif "description" in mx.get("null", []):
                item["description"] = None
        if m.reasoning_content is not None and not items:
            if v1:
                report.lose("reasoning_content")
            else:
                item["reasoning_content"] = m.reasoning_content
        elif "reasoning_content" in mx.get("null", []):
            item["reasoning_content"] = None
        if not items:
            _put_optional(item, mx, "reward", reward)

    text = _text_of(m.content, report)
    calls = m.tool_calls or []
    if text is not None and (not calls or text.strip()) or (not calls and mx.get("class_") == "message_action"):
        if mx.get("class_") == "text_observation":  # an agent-sourced observation
            item = {"class_": "text_observation", "content": text}
            if "source" not in mx.get("absent", []):
                item["source"] = "agent"
            _put_optional(item, mx, "name", m.name)
            _put_optional(item, mx, "reward", reward)
            item.update(mx.get("keys", {}))
            return [item]
        item = {"class_": "message_action", "content": text}
        common(item)
        items.append(item)
    if len(calls) > 1 or (calls and items):
        report.lose("message_grouping")
    for c in calls:
        foreign_extra_losses(c.extra, "adp", report)
        if c.code is not None:
            item = {"class_": "code_action", "language": c.code.language, "content": c.code.source}
        else:
            kw: Any
            if "kwargs_value" in mx:
                kw = mx["kwargs_value"]
            elif c.type == "custom":
                report.lose("custom_input")
                kw = {"input": c.input} if c.input is not None else {}
            else:
                kw = arguments_dict(c.arguments, c.arguments_raw, report)
            item = {"class_": "api_action", "function": c.name, "kwargs": kw}
        common(item)
        if not c.id_generated:
            if v1:
                report.lose("call_ids")
            else:
                item["tool_call_id"] = c.id
        elif "tool_call_id" in mx.get("null", []):
            item["tool_call_id"] = None
        items.append(item)
    if not items:
        item = {"class_": "message_action", "content": text}
        common(item)
        items.append(item)
    if m.thought is not None and not thought_used:
        report.lose("thought")
    if items:
        items[0].update(mx.get("keys", {}))
    return items


class _ADPv1Export:
    """``--to adp-v1``: ADP without ids, schema_version, reasoning or rewards (declared as losses)."""

    NAME = "adp-v1"

    @staticmethod
    def to_ir(record: Any, *, line: int | None = None) -> tuple[Trajectory, ConversionReport]:
        return to_ir(record, line=line)

    @staticmethod
    def from_ir(traj: Trajectory) -> tuple[dict[str, Any], ConversionReport]:
        return from_ir(traj, version="1")


# Extra registry entries this module provides (picked up by trajtune.formats).
EXTRA_FORMATS = {"adp-v1": _ADPv1Export()}
