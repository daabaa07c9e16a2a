"""Tasks for a world generated from tool specs: starting records, goals, and the user's request.

Why: the verifier checks the final state, so a task is a starting state plus the writes that
should happen. Each goal is one write tool with argument values drawn from its schema (enums,
types, bounds, formats, and the argument's name: ``email``, ``city``, ``date``...). A goal on an
existing record names it the way a user would, by its descriptor (``the pet whose name is
"Rex"``), never by id, so the agent must look it up with the world's read tool first (the
expert does, from what the read returns). A world with no such read tool gets the id in the
request instead. One task in three asks for two goals.
"""

from __future__ import annotations

import random
from typing import Any

from trajtune.envs import fncall_vocab as V
from trajtune.envs.spec_world import words, writable

PERSONAL = ("user", "customer", "contact", "employee", "member", "owner", "person", "patient", "student", "author",
            "guest", "client", "attendee", "passenger", "assignee", "recipient")
TAGS = ("urgent", "personal", "work", "travel", "finance", "health", "home", "family", "review", "draft")
POLITE = ("", "Please ", "Kindly ", "I'd like you to ", "Could you ")
RECORDS = (3, 5)  # starting records per resource


def _type(schema: dict[str, Any]) -> str:
    t = schema.get("type", "string")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "string")
    return str(t)


def _string(name: str, resource: str, schema: dict[str, Any], rng: random.Random) -> str:
    ws = set(words(name))
    fmt = schema.get("format", "")
    if fmt == "date" or ws & {"date", "day", "birthday", "deadline"} or name.lower().endswith(("_on", "date")):
        return V.date(rng)
    if fmt == "date-time" or ws & {"datetime", "timestamp"} or name.lower().endswith("_at"):
        return f"{V.date(rng)}T{V.clock(rng)}:00"
    if fmt == "time" or ws & {"time", "hour"}:
        return V.clock(rng)
    if fmt == "email" or "email" in ws:
        return V.email(rng)
    if fmt in ("uri", "url") or ws & {"url", "link", "website", "uri"}:
        return V.url(rng)
    if ws & {"phone", "mobile"}:
        return f"+1-555-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}"
    if ws & {"city", "location", "destination", "origin"}:
        return rng.choice(V.CITIES)
    if "country" in ws:
        return rng.choice(V.COUNTRIES)
    if "address" in ws:
        return V.address(rng)
    if "currency" in ws:
        return rng.choice(V.CURRENCIES)
    if "language" in ws:
        return rng.choice(V.LANGUAGES)
    if ws & {"timezone", "zone"}:
        return rng.choice(V.TIMEZONES)
    if ws & {"tag", "category", "label", "type", "kind", "group"}:
        return rng.choice(TAGS)
    if ws & {"description", "note", "notes", "body", "message", "content", "comment", "text", "reason", "details"}:
        return V.phrase(rng).capitalize()
    if ws & set(PERSONAL) or (ws & {"name", "username"} and resource in PERSONAL):
        return V.person(rng)
    if ws & {"name", "title", "subject", "summary", "topic"}:
        return V.title(rng)
    if ws & {"sku", "code"}:
        return V.sku(rng)
    if "id" in ws:
        return V.order_id(rng)
    return V.phrase(rng)


def draw_value(name: str, schema: dict[str, Any], rng: random.Random, resource: str = "") -> Any:
    """A value that fits ``schema`` and reads like an ``name`` argument."""
    if schema.get("enum"):
        return rng.choice(list(schema["enum"]))
    t = _type(schema)
    if t == "boolean":
        return rng.random() < 0.5
    if t in ("integer", "number"):
        small = bool(set(words(name)) & {"quantity", "count", "seats", "nights", "guests", "priority", "rating",
                                         "level", "floor", "rooms", "people", "size"})
        lo = schema.get("minimum", 1)
        hi = schema.get("maximum", lo + (9 if small else 499))
        if t == "integer":
            return rng.randint(int(lo), int(hi))
        return round(rng.uniform(float(lo), float(hi)), 2)
    if t == "array":
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {"type": "string"}
        n = rng.randint(max(1, int(schema.get("minItems", 1))), max(1, min(3, int(schema.get("maxItems", 3)))))
        out: list[Any] = []
        for _ in range(n * 4):
            v = draw_value(name, items, rng, resource)
            if v not in out:
                out.append(v)
            if len(out) == n:
                break
        return out
    if t == "object":
        props = schema.get("properties") or {}
        return {k: draw_value(k, v, rng, resource) for k, v in props.items() if k in (schema.get("required") or props)}
    return _string(name, resource, schema, rng)


def humanize(name: str) -> str:
    return " ".join(words(name)) or name


def value_text(v: Any) -> str:
    """A value as the request states it: strings quoted, so the agent can copy them exactly."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(value_text(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{humanize(k)} {value_text(x)}" for k, x in v.items()) + "}"
    return str(v)


def join_and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def intent(tool: dict[str, Any]) -> str:
    """What a tool does, as a lower-case verb phrase (its description's first sentence, or its name)."""
    desc = (tool.get("description") or "").strip().split(". ")[0].strip().rstrip(".")
    if not desc or len(desc) > 90:
        desc = humanize(tool["name"])
    return desc[0].lower() + desc[1:] if not desc[:2].isupper() else desc


def starting_records(world: dict[str, Any], rng: random.Random) -> dict[str, list[dict[str, Any]]]:
    """3-5 records per resource, ids in order, descriptors unique within a resource."""
    out: dict[str, list[dict[str, Any]]] = {}
    for res, info in world["resources"].items():
        recs: list[dict[str, Any]] = []
        used: set[str] = set()
        for i in range(rng.randint(*RECORDS)):
            rid: Any = 101 + i if info["id_type"] == "integer" else f"{res[:3]}-{101 + i}"
            rec = {"id": rid, **{k: draw_value(k, s, rng, res) for k, s in info["fields"].items()}}
            d = info.get("descriptor")
            if d:
                while str(rec[d]) in used:
                    rec[d] = f"{rec[d]} {rng.randint(2, 99)}"
                used.add(str(rec[d]))
            recs.append(rec)
        out[res] = recs
    return out


def lookup_tool(world: dict[str, Any], res: str) -> tuple[dict[str, Any], bool] | None:
    """The read tool that finds a record of ``res`` by its descriptor: (tool, filters by it) — a search
    that takes the descriptor, else a list with no required arguments."""
    d = world["resources"][res].get("descriptor")
    lists = [t for t in world["tools"] if t["resource"] == res and t["op"] == "list"]
    for t in lists:
        if d and d in t["parameters"].get("properties", {}):
            return t, True
    for t in lists:
        if not t["parameters"].get("required"):
            return t, False
    return None


def _args(tool: dict[str, Any], rng: random.Random, skip: set[str]) -> dict[str, Any]:
    """Required arguments, and about half of the optional ones (with values that differ from defaults)."""
    props = tool["parameters"].get("properties", {})
    required = set(tool["parameters"].get("required", []))
    out = {}
    for k, s in props.items():
        if k in skip or (k not in required and rng.random() < 0.5):
            continue
        v = draw_value(k, s, rng, tool["resource"])
        if k not in required and "default" in s and v == s["default"]:
            continue
        out[k] = v
    return out


def _target(world: dict[str, Any], tool: dict[str, Any], records: dict[str, Any], rng: random.Random,
            taken: set[Any]) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """An existing record for ``tool`` to act on: (record, how to find it, how the request names it)."""
    res = tool["resource"]
    free = [r for r in records[res] if r["id"] not in taken]
    rec = rng.choice(free)
    taken.add(rec["id"])
    d = world["resources"][res].get("descriptor")
    found = lookup_tool(world, res)
    if d and found is not None:
        via, filters = found
        find = {"resource": res, "field": d, "value": rec[d], "via": via["name"], "filter": filters, "id": rec["id"]}
        return rec, find, f"the {humanize(res)} whose {humanize(d)} is {value_text(rec[d])}"
    return rec, None, f"the {humanize(res)} with id {value_text(rec['id'])}"


def _goal(world: dict[str, Any], tool: dict[str, Any], records: dict[str, Any], rng: random.Random,
          taken: set[Any]) -> tuple[dict[str, Any], str]:
    """One step (tool, args, lookup) and its sentence in the request."""
    op, idp = tool["op"], tool.get("id_param")
    polite = rng.choice(POLITE)
    end = "?" if polite.startswith("Could") else "."
    if idp is None:  # create, or an action on no record: every value is in the request
        args = _args(tool, rng, set())
        said = join_and([f"{humanize(k)} {value_text(v)}" for k, v in args.items()]) if args else ""
        text = f"{polite}{intent(tool)}" + (f" with {said}" if said else "") + end
        return {"tool": tool["name"], "args": args, "find": None}, text
    rec, find, named = _target(world, tool, records, rng, taken)
    if op == "delete":
        return ({"tool": tool["name"], "args": {idp: rec["id"]}, "find": find},
                f"{polite}{intent(tool)}: {named}{end}")
    fields = world["resources"][tool["resource"]]["fields"]
    desc = world["resources"][tool["resource"]].get("descriptor")
    changed = _args(tool, rng, {idp, desc} if op == "update" else {idp})
    if op == "update":  # a change that is a change; required arguments not asked about keep their values
        changed = {k: v for k, v in changed.items() if v != rec.get(k)} or _one_change(tool, rec, rng, {idp, desc})
        req = [k for k in tool["parameters"].get("required", []) if k not in changed and k != idp and k in fields]
        args = {idp: rec["id"], **changed, **{k: rec[k] for k in req}}
        said = join_and([f"its {humanize(k)} to {value_text(v)}" for k, v in changed.items()])
        text = rng.choice((f"{polite}set {said} for {named}{end}", f"{polite}{intent(tool)} — {named}: set {said}{end}"))
        return {"tool": tool["name"], "args": args, "find": find, "copy": req}, text
    args = {idp: rec["id"], **changed}
    said = join_and([f"{humanize(k)} {value_text(v)}" for k, v in changed.items()]) if changed else ""
    return ({"tool": tool["name"], "args": args, "find": find},
            f"{polite}{intent(tool)} for {named}" + (f", with {said}" if said else "") + end)


def _one_change(tool: dict[str, Any], rec: dict[str, Any], rng: random.Random, skip: set[Any]) -> dict[str, Any]:
    props = {k: s for k, s in tool["parameters"].get("properties", {}).items() if k not in skip}
    for _ in range(20):
        k = rng.choice(sorted(props))
        v = draw_value(k, props[k], rng, tool["resource"])
        if v != rec.get(k):
            return {k: v}
    k = sorted(props)[0]
    return {k: draw_value(k, props[k], rng, tool["resource"])}


def build_task(world: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A task's data: starting records, 1-2 goal steps, and the request that asks for them."""
    records = starting_records(world, rng)
    tools = writable(world)
    n = 2 if rng.random() < 1 / 3 else 1
    steps, sentences, taken = [], [], set()
    for tool in rng.sample(tools, n) if len(tools) >= n else [rng.choice(tools)]:
        step, text = _goal(world, tool, records, rng, taken)
        steps.append(step)
        sentences.append(text)
    if len(sentences) == 2:
        second = sentences[1]
        sentences[1] = "Then " + (second if second.startswith("I") else second[0].lower() + second[1:])
    request = " ".join(sentences)
    return {"records": records, "steps": steps, "request": request[0].upper() + request[1:],
            "kinds": [s["tool"] for s in steps]}
