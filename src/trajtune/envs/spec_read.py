"""Reading tool specifications into one shape, for ``trajtune envs generate``.

Why: the tools a user wants an agent trained on are usually described somewhere already: an
OpenAPI document for a REST service, a list of JSON-schema function definitions (OpenAI's
``tools`` list, or bare ``{name, description, parameters}``), or an MCP server's ``tools/list``.
Each is read into ``SpecTool`` (name, description, JSON-schema parameters, and what the format
says about the operation: its HTTP method and path, MCP's read-only hint), so the step that infers
what a tool does (``spec_world``) works on one shape.

Every refusal names the file and the field (``petstore.json: paths./pets.post.requestBody:
$ref '#/components/schemas/Nope' does not resolve``), so a spec that cannot become an environment
says exactly why.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajtune.errors import DataError

HTTP_METHODS = ("get", "post", "put", "patch", "delete")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


@dataclass
class SpecTool:
    """One tool as a spec describes it; ``method``/``path`` for OpenAPI, ``read_only`` for MCP hints."""

    name: str
    description: str
    parameters: dict[str, Any]
    where: str  # file and field it came from, for messages
    method: str | None = None
    path: str | None = None
    path_params: list[str] = field(default_factory=list)
    read_only: bool | None = None
    hints: dict[str, Any] = field(default_factory=dict)  # x-trajtune: {op, resource, id}


class SpecError(DataError):
    """A tool specification that cannot become an environment (names the file and the field)."""


def load_document(path: Path) -> Any:
    """A JSON or YAML document (chosen by the suffix; JSON is tried first for anything else)."""
    if not path.is_file():
        raise SpecError(f"{path}: no such file")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise SpecError(f"{path}: not valid YAML ({e})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); a YAML spec needs a .yaml suffix") from None


def read_spec(path: str | Path) -> list[SpecTool]:
    """The tools of one spec file, whatever its format (OpenAPI 3, a JSON tool list, an MCP tool list)."""
    p = Path(path)
    doc = load_document(p)
    if isinstance(doc, dict) and "openapi" in doc:
        return read_openapi(doc, p.name)
    if isinstance(doc, dict) and "swagger" in doc:
        raise SpecError(f"{p.name}: swagger: OpenAPI 2 (Swagger) is not read; convert it to OpenAPI 3 first "
                        "(e.g. with swagger2openapi)")
    if isinstance(doc, dict) and isinstance(doc.get("tools"), list):
        return read_tool_list(doc["tools"], f"{p.name}: tools")
    if isinstance(doc, list):
        return read_tool_list(doc, p.name)
    raise SpecError(f"{p.name}: not a tool specification: expected an OpenAPI 3 document (an 'openapi' key), a "
                    "JSON list of tools, or an object with a 'tools' list (an MCP tools/list answer)")


# -- JSON-schema tool lists (OpenAI tools, bare functions, MCP tools/list) -------------------

def read_tool_list(items: list[Any], where: str) -> list[SpecTool]:
    out = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise SpecError(f"{at}: a tool must be an object, got {type(item).__name__}")
        fn = item.get("function") if item.get("type") == "function" and isinstance(item.get("function"), dict) else item
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise SpecError(f"{at}.name: a tool needs a name of letters, digits, '_', '.' or '-' (got {name!r})")
        schema = fn.get("parameters", fn.get("inputSchema", fn.get("input_schema")))
        params = check_object_schema(schema if schema is not None else {"type": "object", "properties": {}},
                                     f"{at}.parameters")
        ann = fn.get("annotations") if isinstance(fn.get("annotations"), dict) else {}
        read_only = ann.get("readOnlyHint") if isinstance(ann.get("readOnlyHint"), bool) else None
        out.append(SpecTool(name=name, description=str(fn.get("description") or ""), parameters=params, where=at,
                            read_only=read_only, hints=_hints(fn, at)))
    return out


def check_object_schema(schema: Any, at: str) -> dict[str, Any]:
    """A tool's parameters: a JSON-schema object whose properties are schemas; returned cleaned."""
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise SpecError(f"{at}: parameters must be a JSON-schema object (type: object), got {schema!r:.80}")
    props = schema.get("properties", {}) or {}
    if not isinstance(props, dict):
        raise SpecError(f"{at}.properties: must be an object mapping names to schemas")
    for k, v in props.items():
        if not isinstance(v, dict):
            raise SpecError(f"{at}.properties.{k}: must be a schema object, got {v!r:.60}")
    required = schema.get("required", []) or []
    if not isinstance(required, list) or any(r not in props for r in required):
        missing = [r for r in required if r not in props] if isinstance(required, list) else required
        raise SpecError(f"{at}.required: names {missing!r} that are not in properties")
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = list(required)
    return out


def _hints(obj: dict[str, Any], at: str) -> dict[str, Any]:
    h = obj.get("x-trajtune", {}) or {}
    if not isinstance(h, dict) or set(h) - {"op", "resource", "id"}:
        raise SpecError(f"{at}.x-trajtune: an object with op, resource and/or id (got {h!r:.80})")
    return dict(h)


# -- OpenAPI 3 ------------------------------------------------------------------------------

def _resolve(doc: dict[str, Any], node: Any, at: str, depth: int = 0) -> Any:
    """``node`` with local ``$ref``s replaced (``#/components/...``); nested ones to a fixed depth."""
    if depth > 12:
        raise SpecError(f"{at}: $ref nesting deeper than 12 (a recursive schema cannot become tool arguments)")
    if isinstance(node, dict):
        if "$ref" in node:
            ref = node["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#/"):
                raise SpecError(f"{at}: $ref {ref!r}: only local references (#/components/...) are read")
            target: Any = doc
            for part in ref[2:].split("/"):
                if not isinstance(target, dict) or part not in target:
                    raise SpecError(f"{at}: $ref {ref!r} does not resolve")
                target = target[part]
            return _resolve(doc, target, at, depth + 1)
        return {k: _resolve(doc, v, f"{at}.{k}", depth + 1) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(doc, v, f"{at}[{i}]", depth + 1) for i, v in enumerate(node)]
    return node


def _operation_name(method: str, path: str, op: dict[str, Any]) -> str:
    if isinstance(op.get("operationId"), str) and _NAME.match(op["operationId"]):
        return op["operationId"]
    parts = [p for p in path.strip("/").split("/") if p and not p.startswith("{")]
    return "_".join([method, *parts]).replace("-", "_") or method


def read_openapi(doc: dict[str, Any], fname: str) -> list[SpecTool]:
    """One tool per operation: path and query parameters plus the JSON request body's properties."""
    if not str(doc.get("openapi", "")).startswith("3"):
        raise SpecError(f"{fname}: openapi: version {doc.get('openapi')!r} is not 3.x")
    paths = doc.get("paths")
    if not isinstance(paths, dict) or not paths:
        raise SpecError(f"{fname}: paths: an OpenAPI document needs at least one path")
    out = []
    for path, item in paths.items():
        if not isinstance(item, dict):
            raise SpecError(f"{fname}: paths.{path}: must be an object")
        shared = item.get("parameters", []) or []
        for method in HTTP_METHODS:
            if method in item:
                at = f"{fname}: paths.{path}.{method}"
                op = _resolve(doc, item[method], at)
                out.append(_openapi_tool(doc, path, method, op, shared, at))
    if not out:
        raise SpecError(f"{fname}: paths: no operation ({', '.join(HTTP_METHODS)}) in any path")
    return out


def _openapi_tool(doc: dict[str, Any], path: str, method: str, op: dict[str, Any], shared: list[Any],
                  at: str) -> SpecTool:
    props: dict[str, Any] = {}
    required: list[str] = []
    path_params: list[str] = []
    for i, prm in enumerate([*_resolve(doc, shared, at), *(op.get("parameters", []) or [])]):
        if not isinstance(prm, dict) or not isinstance(prm.get("name"), str):
            raise SpecError(f"{at}.parameters[{i}]: a parameter needs a name")
        if prm.get("in") not in ("path", "query"):
            continue  # headers and cookies are transport, not the agent's arguments
        sch = dict(prm.get("schema") or {"type": "string"})
        if prm.get("description"):
            sch.setdefault("description", prm["description"])
        props[prm["name"]] = sch
        if prm.get("required") or prm.get("in") == "path":
            required.append(prm["name"])
        if prm.get("in") == "path":
            path_params.append(prm["name"])
    body = op.get("requestBody")
    if isinstance(body, dict):
        content = body.get("content") or {}
        js = content.get("application/json") if isinstance(content, dict) else None
        if js is None:
            kinds = ", ".join(content) if isinstance(content, dict) else repr(content)
            raise SpecError(f"{at}.requestBody.content: only application/json bodies become arguments (got {kinds})")
        schema = check_object_schema(js.get("schema") or {}, f"{at}.requestBody.content.application/json.schema")
        for k, v in schema["properties"].items():
            if k in props:
                raise SpecError(f"{at}.requestBody: property {k!r} is also a path or query parameter")
            props[k] = v
        required += schema.get("required", [])
    desc = str(op.get("summary") or op.get("description") or "")
    params: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        params["required"] = required
    return SpecTool(name=_operation_name(method, path, op), description=desc, parameters=params, where=at,
                    method=method, path=path, path_params=path_params, hints=_hints(op, at))


# -- MCP servers ----------------------------------------------------------------------------

def read_mcp_server(command: list[str], timeout_s: float = 30.0) -> list[SpecTool]:
    """The tools a live MCP stdio server lists (needs the ``mcp`` extra); the server is stopped after."""
    from trajtune.envs.adapters.mcp_tools import MCPClient

    shown = " ".join(command)
    with MCPClient(command, start_timeout_s=timeout_s, call_timeout_s=timeout_s) as client:
        specs = client.list_tools()
    items = [{"name": s.name, "description": s.description, "inputSchema": s.parameters,
              "annotations": (s.raw or {}).get("annotations") or {}} for s in specs]
    return read_tool_list(items, f"mcp server `{shown}`: tools")
