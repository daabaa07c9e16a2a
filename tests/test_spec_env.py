"""Environments generated from tool specs: reading the formats, inferring what tools do, the simulated
backend, the verifier on final state, the expert, and ``trajtune envs generate``."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from trajtune.cli.main import app
from trajtune.envs import make_env
from trajtune.envs.base import Task
from trajtune.envs.spec_env import SpecEnv, self_check, shipped_specs
from trajtune.envs.spec_read import SpecError, read_spec, read_tool_list
from trajtune.envs.spec_world import build_world, check_world, singular, words
from trajtune.envs.toolenv import assistant_call, assistant_text

runner = CliRunner()


def _ops(world):
    return {t["name"]: (t["op"], t["resource"], t["id_param"]) for t in world["tools"]}


def test_openapi_operations_refs_and_parameters():
    f = shipped_specs()["petstore"]
    tools = read_spec(f)
    by = {t.name: t for t in tools}
    # the $ref'd body's properties and required list became arguments; path parameters are required
    assert by["addPet"].parameters["required"] == ["name", "species"]
    assert set(by["addPet"].parameters["properties"]) == {"name", "species", "price", "status"}
    assert by["updatePet"].parameters["required"] == ["petId"] and by["getPet"].path_params == ["petId"]
    assert set(by["listPets"].parameters["properties"]) == {"name", "status", "limit"}
    assert _ops(build_world(tools, "petstore", [f.name])) == {
        "listPets": ("list", "pet", None), "addPet": ("create", "pet", None), "getPet": ("get", "pet", "petId"),
        "updatePet": ("update", "pet", "petId"), "deletePet": ("delete", "pet", "petId"),
        # POST on a sub-collection of one pet: an action on that pet
        "recordVaccination": ("action", "pet", "petId")}


def test_tool_lists_in_three_shapes_and_name_inference():
    openai = [{"type": "function", "function": {"name": "createInvoice", "parameters": {
        "type": "object", "properties": {"amount": {"type": "number"}}}}}]
    bare = [{"name": "list_invoices", "description": "List invoices.", "parameters": {"type": "object", "properties": {}}}]
    mcp = [{"name": "void_invoice", "inputSchema": {"type": "object", "properties": {"invoice_id": {"type": "integer"}},
                                                     "required": ["invoice_id"]}, "annotations": {"readOnlyHint": False}},
           {"name": "invoice_report", "inputSchema": {"type": "object", "properties": {}},
            "annotations": {"readOnlyHint": True}}]
    tools = read_tool_list(openai + bare + mcp, "t.json")
    world = build_world(tools, "inv", ["t.json"])
    assert _ops(world) == {"createInvoice": ("create", "invoice", None), "list_invoices": ("list", "invoice", None),
                           # no verb it knows, not read-only, names an invoice by id: an action on the invoice
                           "void_invoice": ("action", "invoice", "invoice_id"),
                           # no verb, read-only: a read
                           "invoice_report": ("list", "report", None)}
    assert world["resources"]["invoice"]["id_type"] == "integer"
    assert words("listCalendarEvents") == ["list", "calendar", "events"] and words("a.b-c_d") == ["a", "b", "c", "d"]
    assert [singular(w) for w in ("events", "categories", "boxes", "status", "address")] == \
        ["event", "category", "box", "status", "address"]


def test_hints_override_inference_and_are_checked():
    tool = {"name": "frobnicate", "x-trajtune": {"op": "delete", "resource": "widget", "id": "wid"},
            "parameters": {"type": "object", "properties": {"wid": {"type": "string"}}, "required": ["wid"]}}
    assert _ops(build_world(read_tool_list([tool], "x"), "w", [])) == {"frobnicate": ("delete", "widget", "wid")}
    bad = {**tool, "x-trajtune": {"op": "explode"}}
    with pytest.raises(SpecError, match=r"x\[0\]\.x-trajtune\.op: 'explode'"):
        build_world(read_tool_list([bad], "x"), "w", [])
    with pytest.raises(SpecError, match=r"x-trajtune\.id: 'nope' is not an argument"):
        build_world(read_tool_list([{**tool, "x-trajtune": {"id": "nope"}}], "x"), "w", [])


@pytest.mark.parametrize("doc, where", [
    ({"openapi": "3.0.0", "paths": {"/a": {"post": {"requestBody": {"content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/Nope"}}}}}}}}, r"paths\./a\.post.*\$ref '#/components/schemas/Nope' does not resolve"),
    ({"openapi": "3.0.0", "paths": {"/a": {"post": {"requestBody": {"content": {"text/plain": {}}}}}}},
     r"paths\./a\.post\.requestBody\.content: only application/json"),
    ({"openapi": "3.0.0", "paths": {}}, r"paths: an OpenAPI document needs at least one path"),
    ({"swagger": "2.0"}, r"swagger: OpenAPI 2"),
    ([{"name": "bad name!"}], r"\[0\]\.name: a tool needs a name"),
    ([{"name": "f", "parameters": {"type": "object", "properties": {"a": {}}, "required": ["b"]}}],
     r"\[0\]\.parameters\.required: names \['b'\]"),
    ([{"name": "f", "parameters": {"type": "array"}}], r"\[0\]\.parameters: parameters must be a JSON-schema object"),
    ({"something": 1}, r"not a tool specification"),
])
def test_bad_specs_name_the_file_and_field(tmp_path, doc, where):
    f = tmp_path / "api.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=where) as e:
        read_spec(f)
    assert "api.json" in str(e.value)


def test_worlds_that_cannot_be_verified_are_refused(tmp_path):
    reads = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
             {"name": "list_cities"}]
    with pytest.raises(SpecError, match="no tool changes state: all 2 tools read"):
        build_world(read_tool_list(reads, "r"), "r", [])
    # the only write renames: requests find records by their name, so no goal can be stated
    rename = [{"name": "find_tags", "parameters": {"type": "object", "properties": {"name": {"type": "string"}}}},
              {"name": "update_tag", "parameters": {"type": "object", "required": ["tag_id"], "properties": {
                  "tag_id": {"type": "integer"}, "name": {"type": "string"}}}}]
    with pytest.raises(SpecError, match=r"no write can be a goal: update_tag \(rename\[1\]\)"):
        build_world(read_tool_list(rename, "rename"), "rename", [])
    world = build_world(read_tool_list(CRM, "crm"), "crm", [])
    world["tools"] = [t for t in world["tools"] if t["op"] in ("list", "get")] + [
        {**t, "parameters": {"type": "object", "properties": {"contact_id": t["parameters"]["properties"]["contact_id"]}}}
        for t in world["tools"] if t["op"] == "update"]
    with pytest.raises(SpecError, match=r"edited\.json: no write can be a goal: update_contact"):
        check_world(world, "edited.json")
    with pytest.raises(SpecError, match="already used by"):
        build_world(read_tool_list([{"name": "add_x"}, {"name": "add_x"}], "d"), "d", [])
    f = tmp_path / "broken.json"
    f.write_text("{\n  \"tools\": [\n")
    with pytest.raises(SpecError, match=r"broken\.json:3: not valid JSON"):
        read_spec(f)


CRM = [{"name": "create_contact", "parameters": {"type": "object", "required": ["name"], "properties": {
           "name": {"type": "string"}, "stage": {"type": "string", "enum": ["lead", "customer"], "default": "lead"}}}},
       {"name": "find_contacts", "parameters": {"type": "object", "properties": {"name": {"type": "string"},
                                                                                 "limit": {"type": "integer"}}}},
       {"name": "update_contact", "parameters": {"type": "object", "required": ["contact_id"], "properties": {
           "contact_id": {"type": "integer"}, "stage": {"type": "string", "enum": ["lead", "customer"]}}}},
       {"name": "delete_contact", "parameters": {"type": "object", "required": ["contact_id"],
                                                 "properties": {"contact_id": {"type": "integer"}}}},
       {"name": "log_call", "parameters": {"type": "object", "required": ["contact_id", "minutes"], "properties": {
           "contact_id": {"type": "integer"}, "minutes": {"type": "integer"}}}}]
RECORDS = {"contact": [{"id": 101, "name": "Ada Lovelace", "stage": "lead"},
                       {"id": 102, "name": "Alan Turing", "stage": "customer"}]}


def _env(steps):
    world = build_world(read_tool_list(CRM, "crm"), "crm", [])
    env = SpecEnv(world=world)
    env.reset(Task("t", 1, data={"records": RECORDS, "steps": steps, "request": "do it"}))
    return env


def _obs(env, tool, **args):
    return env.step(assistant_call(tool, **args)).observations[0].text()


def test_backend_semantics_on_a_hand_built_world():
    env = _env([{"tool": "create_contact", "args": {"name": "Grace Hopper"}, "find": None}])
    # substring, case-insensitive search; a limit-like argument cuts the list
    assert [r["id"] for r in json.loads(_obs(env, "find_contacts", name="a"))] == [101, 102]
    assert [r["id"] for r in json.loads(_obs(env, "find_contacts", name="TURING"))] == [102]
    assert len(json.loads(_obs(env, "find_contacts", limit=1))) == 1
    # create takes the next id after the starting records and fills schema defaults
    assert json.loads(_obs(env, "create_contact", name="Grace Hopper")) == {"id": 103, "name": "Grace Hopper",
                                                                             "stage": "lead"}
    # the state equals the goal's (stage omitted = its default "lead"): success; reads did not matter
    assert env.success()
    assert _obs(env, "update_contact", contact_id=999, stage="customer") == "Error: no contact with id 999"
    assert env.success()  # an unknown id changed nothing
    assert _obs(env, "update_contact", contact_id=101, stage="customer").startswith("{")
    assert not env.success()  # an extra write fails the goal
    assert json.loads(_obs(env, "delete_contact", contact_id=102)) == {"deleted": 102}
    assert [r["id"] for r in json.loads(_obs(env, "find_contacts"))] == [101, 103]
    # the next create does not reuse a deleted id
    assert json.loads(_obs(env, "create_contact", name="X"))["id"] == 104


def test_actions_are_logged_and_checked_against_the_goal():
    goal = [{"tool": "log_call", "args": {"contact_id": 102, "minutes": 5}, "find": None}]
    env = _env(goal)
    assert _obs(env, "log_call", contact_id=102, minutes=6).startswith("{")
    assert not env.success()  # a wrong value
    env = _env(goal)
    assert "Error: no contact with id 7" == _obs(env, "log_call", contact_id=7, minutes=5)
    _obs(env, "log_call", contact_id=102, minutes=5)
    assert env.success()
    _obs(env, "log_call", contact_id=102, minutes=5)
    assert not env.success()  # done twice


@pytest.mark.parametrize("spec", sorted(shipped_specs()))
def test_shipped_specs_expert_solves_idle_fails_and_ids_stay_hidden(spec):
    env = make_env("spec", path=spec)
    report = self_check(env.world, n=24, seed=3)
    assert report["expert_solved"] == 24 and report["idle_solved"] == 0, report
    tasks = env.tasks("test", 24, seed=3)
    looked_up = 0
    for t in tasks:
        for step in t.data["steps"]:
            if step["find"] is not None:
                looked_up += 1
                # the request names the record by its descriptor, never by the id the agent must look up
                assert json.dumps(step["find"]["id"]) not in t.data["request"]
                assert str(step["find"]["value"]) in t.data["request"]
    assert looked_up > 0
    traj = make_env("spec", path=spec).expert(tasks[0])
    n_looks = sum(s["find"] is not None for s in tasks[0].data["steps"])
    calls = [c.name for m in traj.messages for c in (m.tool_calls or [])]
    assert len(calls) == len(tasks[0].data["steps"]) + n_looks


def test_wrong_record_fails_even_with_the_right_tool():
    env = make_env("spec", path="crm")
    task = next(t for t in env.tasks("train", 60, seed=0)
                if len(t.data["steps"]) == 1 and t.data["steps"][0]["tool"] == "delete_contact")
    env.reset(task)
    target = task.data["steps"][0]["args"]["contact_id"]
    other = next(r["id"] for r in task.data["records"]["contact"] if r["id"] != target)
    env.step(assistant_call("delete_contact", contact_id=other))
    r = env.step(assistant_text("Done."))
    assert r.done and r.reward == 0.0 and not env.success()


MCP_TODO = textwrap.dedent('''
    try:
        from mcp.server.mcpserver import MCPServer as Server   # mcp 2.x
    except ImportError:
        from mcp.server.fastmcp import FastMCP as Server       # mcp 1.x
    server = Server("todo")

    @server.tool()
    def create_todo(title: str, priority: int = 1) -> str:
        """Add a to-do item."""
        return "ok"

    @server.tool()
    def list_todos(title: str = "") -> str:
        """List to-do items whose title matches."""
        return "[]"

    @server.tool()
    def complete_todo(todo_id: int) -> str:
        """Mark a to-do item as done."""
        return "ok"

    if __name__ == "__main__":
        server.run()
''')


def test_cli_generate_from_files_and_from_a_live_mcp_server(tmp_path):
    out = tmp_path / "env"
    files = [str(shipped_specs()[s]) for s in ("library", "calendar")]
    r = runner.invoke(app, ["envs", "generate", *files, "--out", str(out), "--check", "8"])
    assert r.exit_code == 0, r.output
    world = json.loads((out / "environment.json").read_text())
    assert {"search_books", "create_event"} <= {t["name"] for t in world["tools"]}
    assert "the expert solves 8" in r.output and "ending at once solves 0" in r.output
    before = (out / "environment.json").read_text()
    r = runner.invoke(app, ["envs", "generate", *files, "--out", str(out)])
    assert r.exit_code != 0 and "--overwrite" in r.output and (out / "environment.json").read_text() == before
    r = runner.invoke(app, ["envs", "show", "spec", "--env-arg", f"path={out}", "--seed", "1"])
    assert r.exit_code == 0 and "success=True" in r.output, r.output
    data = tmp_path / "d.jsonl"
    r = runner.invoke(app, ["data", "generate", "--env", "spec", "--env-arg", f"path={out}", "--n", "3", "-o", str(data)])
    assert r.exit_code == 0 and "3/3 expert successes" in r.output, r.output
    pytest.importorskip("mcp", reason="the mcp extra is not installed")
    server = tmp_path / "todo.py"
    server.write_text(MCP_TODO)
    r = runner.invoke(app, ["envs", "generate", "--mcp", f"{sys.executable} {server}", "--out", str(tmp_path / "m"),
                            "--check", "6"])
    assert r.exit_code == 0, r.output
    world = json.loads((tmp_path / "m" / "environment.json").read_text())
    assert _ops(world) == {"create_todo": ("create", "todo", None), "list_todos": ("list", "todo", None),
                           "complete_todo": ("action", "todo", "todo_id")}


def test_cli_generate_bad_input(tmp_path):
    r = runner.invoke(app, ["envs", "generate", "--out", str(tmp_path / "e")])
    assert r.exit_code != 0 and "give spec files or --mcp" in r.output
    f = tmp_path / "reads.json"
    f.write_text(json.dumps([{"name": "get_weather"}]))
    r = runner.invoke(app, ["envs", "generate", str(f), "--out", str(tmp_path / "e")])
    assert r.exit_code != 0 and "no tool changes state" in r.output and not (tmp_path / "e").exists()
    r = runner.invoke(app, ["envs", "show", "spec", "--env-arg", f"path={tmp_path / 'missing'}"])
    assert r.exit_code != 0 and "not a shipped spec" in r.output
