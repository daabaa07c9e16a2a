"""``spec``: a verifiable environment generated from tool specifications (``trajtune envs generate``).

The world (``environment.json``, see ``spec_world``) says what each tool does to which records;
this module is the simulated backend that does it, on state held in Python:

- ``create`` adds a record (the next id) and returns it; ``get`` returns one by id; ``list``
  returns the records its arguments match (strings by case-insensitive substring, the rest by
  equality; ``limit``-like arguments cut the list); ``update`` sets the given fields; ``delete``
  removes the record; ``action`` checks its record exists (when it names one) and is recorded in
  the action log. An unknown id is the agent's mistake: an ``Error: ...`` observation.
- Arguments the agent leaves out take the schema's default, so leaving out a default equals
  stating it.
- **Verifier**: at reset the task's goal steps are applied to a copy of the starting state; the
  episode succeeds when the tables and the action log equal that copy at the end. An extra write,
  a wrong value or a missing step fails it; reads are free.
- **Expert**: it reads the request's record through the world's read tool (the id is never in the
  request when a read can find it), takes the id from what the read returned, then writes; it
  sees only the observations the agent sees.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

from trajtune.envs.base import Task
from trajtune.envs.spec_read import SpecError, read_spec
from trajtune.envs.spec_tasks import build_task
from trajtune.envs.spec_world import build_world, check_world
from trajtune.envs.tools import ToolError
from trajtune.envs.toolenv import ToolEnv, assistant_call, assistant_text, make_tasks, scripted_policy
from trajtune.schema import Message, ToolSpec

WORLD_FILE = "environment.json"
LIMIT_NAMES = ("limit", "max_results", "page_size", "top_k", "count", "size", "n")


def shipped_specs() -> dict[str, Path]:
    """The example specs that ship with trajtune, by name (``petstore``, ``calendar``, ...)."""
    root = Path(__file__).resolve().parent.parent / "data" / "specs"
    return {f.name.split(".")[0]: f for f in sorted(root.iterdir()) if f.is_file()}


def world_from(path: str | Path) -> dict[str, Any]:
    """A world from a generated directory, its ``environment.json``, a spec file, or a shipped spec's name."""
    p = Path(path)
    if p.is_dir() or p.name == WORLD_FILE:
        return load_world(p)
    if p.is_file():
        return build_world(read_spec(p), p.name.split(".")[0], [p.name])
    shipped = shipped_specs()
    if str(path) in shipped:
        f = shipped[str(path)]
        return build_world(read_spec(f), str(path), [f.name])
    raise SpecError(f"{path}: no such file or directory, and not a shipped spec ({', '.join(shipped)})")


def load_world(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        p = p / WORLD_FILE
    if not p.is_file():
        raise SpecError(f"{p}: no generated environment here; make one with `trajtune envs generate SPEC --out DIR`")
    try:
        world = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise SpecError(f"{p}:{e.lineno}: not valid JSON ({e.msg})") from None
    return check_world(world, str(p))


def _defaults(tool: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    props = tool["parameters"].get("properties", {})
    return {**{k: s["default"] for k, s in props.items() if "default" in s and k not in args}, **args}


def _matches(rec: dict[str, Any], key: str, want: Any) -> bool:
    have = rec.get(key)
    if isinstance(want, str) and isinstance(have, str):
        return want.lower() in have.lower()
    return bool(have == want)


class SpecEnv(ToolEnv):
    """A world generated from tool specs: records the tools create, read, change and delete."""

    name = "spec"
    description = "A verifiable environment generated from OpenAPI / JSON-schema / MCP tool specs (trajtune envs generate)."
    max_turns = 8
    system_prompt = ("You are a helpful agent with access to an API through the tools below. Use them to do what "
                     "the user asks; look records up before you change them. When everything is done, reply with a "
                     "short final answer.")

    def __init__(self, path: str | Path = "petstore", world: dict[str, Any] | None = None) -> None:
        """``path``: a directory made by ``trajtune envs generate``, a spec file (generated on the fly), or
        the name of a shipped spec (petstore, library, calendar, notes, crm); ``world``: a world dict instead."""
        super().__init__()
        self.world = world_from(path) if world is None else check_world(world, "world")
        self.by_name = {t["name"]: t for t in self.world["tools"]}
        self.tables: dict[str, dict[str, dict[str, Any]]] = {}
        self.log: list[dict[str, Any]] = []
        self.counters: dict[str, int] = {}
        self.expected: tuple[Any, Any] | None = None

    # -- tasks ----------------------------------------------------------------------------------
    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        return make_tasks(f"spec-{self.world['name']}", split, n, seed, lambda rng: build_task(self.world, rng))

    def prompt(self, task: Task) -> str:
        return str(task.data["request"])

    def setup(self, task: Task) -> None:
        if not isinstance(task.data.get("steps"), list):
            raise SpecError(f"task {task.id} has no goal steps: it was not made by this environment")
        self._start(task)
        for step in task.data["steps"]:
            self._call(self.by_name[step["tool"]], dict(step["args"]))
        self.expected = (copy.deepcopy(self.tables), copy.deepcopy(self.log))
        self._start(task)

    def _start(self, task: Task) -> None:
        recs = task.data["records"]
        self.tables = {res: {str(r["id"]): dict(r) for r in rs} for res, rs in recs.items()}
        self.counters = {res: 101 + len(rs) for res, rs in recs.items()}
        self.log = []

    def success(self) -> bool:
        return self.expected is not None and (self.tables, self.log) == self.expected

    # -- the simulated backend ------------------------------------------------------------------
    def tool_functions(self) -> dict[str, Callable[..., Any]]:
        return {t["name"]: self._bound(t) for t in self.world["tools"]}

    def tool_specs(self) -> dict[str, ToolSpec]:
        return {t["name"]: ToolSpec(name=t["name"], description=t.get("description", ""),
                                    parameters=t["parameters"]) for t in self.world["tools"]}

    def _bound(self, tool: dict[str, Any]) -> Callable[..., Any]:
        return lambda **args: self._call(tool, args)

    def _new_id(self, res: str) -> Any:
        """The next id after every record the task started with or created (a deleted one's is not reused)."""
        n = self.counters.get(res, 101)
        self.counters[res] = n + 1
        return n if self.world["resources"][res]["id_type"] == "integer" else f"{res[:3]}-{n}"

    def _record(self, tool: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
        res, idp = tool["resource"], tool["id_param"]
        key = str(args[idp])
        if key not in self.tables[res]:
            raise ToolError(f"no {res} with id {args[idp]!r}")
        return self.tables[res][key]

    def _call(self, tool: dict[str, Any], args: dict[str, Any]) -> Any:
        op, res, idp = tool["op"], tool["resource"], tool.get("id_param")
        args = _defaults(tool, args)
        table = self.tables.setdefault(res, {})
        if op == "create":
            rid = self._new_id(res)
            rec = {"id": rid, **{k: v for k, v in args.items() if k != idp}}
            table[str(rid)] = rec
            return rec
        if op == "list":
            fields = self.world["resources"][res]["fields"]
            found = [r for r in table.values()
                     if all(_matches(r, k, v) for k, v in args.items() if k in fields or k == "id")]
            limit = next((v for k, v in args.items() if k in LIMIT_NAMES and k not in fields and isinstance(v, int)), None)
            return found[:limit] if limit is not None else found
        if op == "action" and idp is None:
            self.log.append({"tool": tool["name"], "arguments": args})
            return {"status": "done", "action": tool["name"]}
        rec = self._record(tool, args)
        if op == "get":
            return rec
        if op == "update":
            rec.update({k: v for k, v in args.items() if k != idp})
            return rec
        if op == "delete":
            del table[str(args[idp])]
            return {"deleted": args[idp]}
        self.log.append({"tool": tool["name"], "arguments": args})
        return {"status": "done", "action": tool["name"], res: rec["id"]}

    def state_view(self) -> str:
        return json.dumps({"tables": self.tables, "log": self.log}, sort_keys=True)[:2000]

    # -- the scripted expert --------------------------------------------------------------------
    def expert_policy(self, task: Task) -> Callable[[list[Message], list[ToolSpec]], Message]:
        return scripted_policy(self._script(task))

    def _script(self, task: Task) -> Generator[Message, str, None]:
        done = []
        for step in task.data["steps"]:
            args = dict(step["args"])
            find = step.get("find")
            if find is not None:
                via = self.by_name[find["via"]]
                obs = yield assistant_call(via["name"], **({find["field"]: find["value"]} if find["filter"] else {}))
                rec = _first_match(obs, find["field"], find["value"])
                args[self.by_name[step["tool"]]["id_param"]] = rec["id"]
                for k in step.get("copy", []):
                    args[k] = rec[k]
            yield assistant_call(step["tool"], **args)
            done.append(step["tool"])
        yield assistant_text(random.Random(task.seed).choice(("Done.", "All done.", "It is done.", "Done: "
                                                              + ", ".join(done) + ".")))


def _first_match(observation: str, field: str, value: Any) -> dict[str, Any]:
    try:
        found = json.loads(observation)
    except json.JSONDecodeError:
        raise RuntimeError(f"the expert's lookup did not return JSON: {observation[:200]}") from None
    for rec in found if isinstance(found, list) else [found]:
        if isinstance(rec, dict) and rec.get(field) == value:
            return rec
    raise RuntimeError(f"the expert's lookup found no record with {field} = {value!r}: {observation[:200]}")


def self_check(world: dict[str, Any], n: int = 20, seed: int = 0) -> dict[str, Any]:
    """Whether the world can be learned from: the expert solves every sampled task, and ending at
    once (no tool call) solves none. A world failing either has a verifier that means nothing."""
    from trajtune.envs.toolenv import assistant_text

    env = SpecEnv(world=world)
    tasks = env.tasks("train", n, seed)
    solved, idle, turns, failures = 0, 0, [], []
    for t in tasks:
        try:
            traj = env.expert(t)
        except RuntimeError as e:  # the expert's lookup found nothing: the world's reads do not work
            failures.append(f"{t.id}: {e}")
            continue
        ok = bool(traj.outcome and traj.outcome.success)
        solved += ok
        if not ok:
            failures.append(f"{t.id}: the expert's episode ended {traj.outcome.termination if traj.outcome else '?'} "
                            f"without reaching the goal state")
        turns.append(sum(1 for m in traj.messages if m.role == "assistant"))
        env.reset(t)
        env.step(assistant_text("Done."))
        idle += env.success()
    return {"tasks": n, "expert_solved": solved, "idle_solved": idle, "failures": failures[:5],
            "mean_expert_turns": round(sum(turns) / max(1, len(turns)), 2)}
