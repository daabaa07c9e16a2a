"""From tool specifications to a world: what each tool does to which records.

Why: a verifiable environment needs state that the tools change and a final state to check. A
spec says what a tool takes, rarely what it does; trajtune infers it the way REST and tool names
already say it, so any CRUD-shaped API becomes a simulated backend with no code:

- **operation**: OpenAPI methods first (GET on an item: ``get``; GET on a collection: ``list``;
  POST on a collection: ``create``; PUT/PATCH: ``update``; DELETE: ``delete``; POST on an item:
  ``action``); else the name's verb (``create_event``, ``listEvents``, ``cancel_booking``); else
  MCP's ``readOnlyHint`` (read-only: ``list``); anything else that is not read-only is an
  ``action``, recorded in an action log. ``x-trajtune: {op, resource, id}`` on a tool overrides.
- **resource**: the path's last collection (``/pets/{petId}`` → ``pet``) or the name's last word
  (``update_calendar_event`` → ``event``), singular.
- **id argument**: the path parameter, or an argument named ``id``, ``<resource>_id``,
  ``<resource>Id``.
- **record fields**: the create tool's other arguments (else the update tool's, else ``name``).

A world is plain JSON (``environment.json``), so a user can read and edit what was inferred.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from trajtune.envs.spec_read import SpecError, SpecTool

FORMAT = "trajtune-spec-env/1"
OPS = ("create", "get", "list", "update", "delete", "action")
READS = ("get", "list")
VERBS: dict[str, tuple[str, ...]] = {
    "create": ("create", "add", "new", "insert", "register", "book", "schedule", "post", "make", "open", "submit",
               "place", "upload", "invite", "enroll"),
    "update": ("update", "set", "edit", "modify", "change", "rename", "patch", "put", "move", "assign", "mark",
               "reschedule", "upsert"),
    "delete": ("delete", "remove", "cancel", "drop", "destroy", "unregister", "unsubscribe", "erase"),
    "get": ("get", "fetch", "read", "show", "describe", "retrieve", "view", "lookup", "check"),
    "list": ("list", "search", "find", "query", "filter", "browse", "all", "count"),
}
_VERB_OP = {v: op for op, vs in VERBS.items() for v in vs}
DESCRIPTOR_NAMES = ("name", "title", "email", "username", "subject", "label", "summary", "full_name", "code")


def words(name: str) -> list[str]:
    """``listCalendarEvents`` / ``list_calendar-events`` / ``calendar.list`` → lower-case words."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w.lower() for w in re.split(r"[^A-Za-z0-9]+", spaced) if w]


def singular(word: str) -> str:
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("ses", "xes", "ches", "shes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) > 3:
        return word[:-1]
    return word


def _id_names(resource: str) -> set[str]:
    return {"id", f"{resource}_id", f"{resource}id"}


def _find_id(props: dict[str, Any], resource: str, candidates: list[str]) -> str | None:
    for c in candidates:  # path parameters first
        if c in props:
            return c
    for k in props:
        if k.lower().replace("-", "_") in _id_names(resource) or "".join(words(k)) in {f"{resource}id", "id"}:
            return k
    return None


@dataclass
class Inferred:
    op: str
    resource: str
    id_param: str | None


def _op_from_http(t: SpecTool) -> str:
    item = bool(t.path and re.search(r"\{[^}]+\}/?$", t.path))
    if t.method == "post" and not item and t.path_params:  # POST /tickets/{id}/comments: an action on the ticket
        return "action"
    return {"get": "get" if item else "list", "post": "action" if item else "create", "put": "update",
            "patch": "update", "delete": "delete"}[t.method or "post"]


def _resource(t: SpecTool, op: str) -> str:
    if t.path:
        segs = [p for p in t.path.strip("/").split("/") if p and not re.fullmatch(r"v\d+|api", p)]
        if op == "action" and t.path_params and not segs[-1].startswith("{"):
            segs = segs[:max(i for i, p in enumerate(segs) if p.startswith("{"))]  # the parent the action is on
        parts = [p for p in segs if not p.startswith("{")]
        if parts and words(parts[-1]):
            return singular(words(parts[-1])[-1])
    ws = words(t.name)
    if ws and ws[0] in _VERB_OP:
        ws = ws[1:]
    ws = [w for w in ws if w not in ("by", "id", "all", "details", "info")]
    return singular(ws[-1]) if ws else "item"


def infer(t: SpecTool) -> Inferred:
    """What ``t`` does (see the module docstring), with ``x-trajtune`` hints winning."""
    if "op" in t.hints:
        op = str(t.hints["op"])
        if op not in OPS:
            raise SpecError(f"{t.where}.x-trajtune.op: {op!r} is not one of {', '.join(OPS)}")
    elif t.method:
        op = _op_from_http(t)
    else:
        ws = words(t.name)
        op = next((_VERB_OP[w] for w in ws[:2] if w in _VERB_OP), "")
        if t.read_only is True and op not in READS:
            op = "list"
        elif t.read_only is False and op in READS:
            op = "action"
        op = op or "action"
    resource = str(t.hints.get("resource") or _resource(t, op))
    props = t.parameters.get("properties", {})
    id_param = t.hints.get("id") or _find_id(props, resource, t.path_params)
    if id_param is not None and id_param not in props:
        raise SpecError(f"{t.where}.x-trajtune.id: {id_param!r} is not an argument of {t.name}")
    if op in ("get", "update", "delete") and id_param is None:
        op = "list" if op == "get" else "action"  # nothing names the record: a search, or an action
    return Inferred(op, resource, id_param)


def _fields(tools: list[dict[str, Any]]) -> dict[str, Any]:
    for op in ("create", "update"):
        for t in tools:
            if t["op"] == op:
                props = {k: v for k, v in t["parameters"].get("properties", {}).items() if k != t["id_param"]}
                if props:
                    return props
    return {"name": {"type": "string"}}


def _descriptor(fields: dict[str, Any]) -> str | None:
    """The field a request names a record by (a unique string the user would know)."""
    strings = [k for k, v in fields.items() if v.get("type") == "string" and "enum" not in v]
    for pref in DESCRIPTOR_NAMES:
        for k in strings:
            if "_".join(words(k)) == pref or words(k)[-1:] == [pref]:
                return k
    return strings[0] if strings else None


def _link_actions(out_tools: list[dict[str, Any]], tools: list[SpecTool]) -> None:
    """An action named for what it does (``invite_guest``, ``log_call``) acts on the record its id
    argument names (``event_id``): it belongs to that resource, not to a resource of its own."""
    known = {t["resource"] for t in out_tools if t["op"] != "action"}
    for t, spec in zip(out_tools, tools):
        if t["op"] != "action" or t["id_param"] is not None or "resource" in spec.hints:
            continue
        for k in t["parameters"].get("properties", {}):
            res = next((r for r in known if k.lower().replace("-", "_") in _id_names(r) - {"id"}
                        or "".join(words(k)) == f"{r}id"), None)
            if res is not None:
                t["resource"], t["id_param"] = res, k
                break


def build_world(tools: list[SpecTool], name: str, sources: list[str]) -> dict[str, Any]:
    """The world JSON for ``tools``: each tool with its operation, resource and id argument; each
    resource with its record fields, the field requests name records by, and its id type."""
    if not tools:
        raise SpecError("the specs hold no tools")
    seen: dict[str, str] = {}
    out_tools = []
    for t in tools:
        if t.name in seen:
            raise SpecError(f"{t.where}: tool name {t.name!r} is already used by {seen[t.name]}")
        seen[t.name] = t.where
        inf = infer(t)
        out_tools.append({"name": t.name, "description": t.description, "parameters": t.parameters,
                          "op": inf.op, "resource": inf.resource, "id_param": inf.id_param, "source": t.where})
    _link_actions(out_tools, tools)
    if all(t["op"] in READS for t in out_tools):
        raise SpecError(f"no tool changes state: all {len(out_tools)} tools read ({', '.join(seen)}), so there is no "
                        "final state to verify; mark the ones that write with x-trajtune: {op: create|update|delete|"
                        "action}")
    resources: dict[str, Any] = {}
    for res in sorted({t["resource"] for t in out_tools}):
        mine = [t for t in out_tools if t["resource"] == res]
        fields = _fields(mine)
        id_types = {t["parameters"]["properties"][t["id_param"]].get("type") for t in mine if t["id_param"]}
        resources[res] = {"fields": fields, "descriptor": _descriptor(fields),
                          "id_type": "integer" if "integer" in id_types else "string"}
    return _goals_possible({"format": FORMAT, "name": name, "sources": sources, "tools": out_tools,
                            "resources": resources}, "the specs")


def writable(world: dict[str, Any]) -> list[dict[str, Any]]:
    """The tools a goal can use: writes with something to set (an update needs a field besides the record's
    id and its descriptor, the name requests find it by, which a goal never changes)."""
    out = []
    for t in world["tools"]:
        props = t["parameters"].get("properties", {})
        if t["op"] in READS:
            continue
        descriptor = world["resources"][t["resource"]].get("descriptor")
        if t["op"] == "update" and not set(props) - {t.get("id_param"), descriptor}:
            continue
        out.append(t)
    return out


def check_world(world: Any, where: str) -> dict[str, Any]:
    """A world read back from JSON (a user may have edited it): the keys the environment relies on."""
    if not isinstance(world, dict) or world.get("format") != FORMAT:
        raise SpecError(f"{where}: format: not a generated environment ({FORMAT}); make one with "
                        "`trajtune envs generate SPEC --out DIR`")
    for key in ("tools", "resources"):
        if not world.get(key):
            raise SpecError(f"{where}: {key}: missing or empty")
    for i, t in enumerate(world["tools"]):
        for key in ("name", "parameters", "op", "resource"):
            if key not in t:
                raise SpecError(f"{where}: tools[{i}].{key}: missing")
        if t["op"] not in OPS:
            raise SpecError(f"{where}: tools[{i}].op: {t['op']!r} is not one of {', '.join(OPS)}")
        if t["resource"] not in world["resources"]:
            raise SpecError(f"{where}: tools[{i}].resource: {t['resource']!r} is not in resources")
        if t.get("id_param") and t["id_param"] not in t["parameters"].get("properties", {}):
            raise SpecError(f"{where}: tools[{i}].id_param: {t['id_param']!r} is not one of its arguments")
    return _goals_possible(world, where)


def _goals_possible(world: dict[str, Any], where: str) -> dict[str, Any]:
    """A world whose writes can set nothing (e.g. its only update renames: the descriptor is how a goal
    names the record, so it never changes) has no task to make."""
    if not writable(world):
        writes = [t["name"] + (f" ({t['source']})" if t.get("source") else "") for t in world["tools"]
                  if t["op"] not in READS]
        raise SpecError(f"{where}: no write can be a goal: {', '.join(writes)} can only change a record's id or "
                        "the name requests find it by; give an update another argument, or mark a tool with "
                        "x-trajtune: {op: create|delete|action}")
    return world
