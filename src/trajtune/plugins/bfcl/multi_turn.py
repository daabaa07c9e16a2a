"""BFCL multi-turn categories as a trajtune ``Environment``.

The episode is BFCL's: several user turns; within a turn the agent may take up to 20 tool-call
steps and ends the turn with a message that has no tool call. Tools run against the executable
API classes shipped in ``bfcl_eval`` (a simulated file system, trading bot, travel API, ...),
and success is BFCL's check, done after every turn whose ground truth is non-empty:

1. the agent made at least one tool call in that turn;
2. the public attributes of every API instance equal those of a second set of instances on
   which the ground-truth calls were replayed (``state_checker``);
3. every ground-truth execution result of that turn appears (as a multiset, any order) among
   all the agent's execution results so far (``response_checker``).

Turns with an empty ground truth (``miss_param``/``miss_func``: the request cannot be done yet)
are not checked, as in bfcl-eval 2026.3.23. Held-out functions (``miss_func``) are added at
their turn: the user message then lists them (BFCL's prompting-mode text) and ``StepResult.info
["tools"]`` carries the full new tool list for runners that can re-render tools.

Safety: nothing is ``eval``-ed. The agent's calls go through ``APIDispatcher``, which only
calls public methods defined on the instantiated API classes *and* named in the entry's BFCL
function docs, with keyword arguments from the parsed JSON. The ground truth (Python call
strings like ``"cd(folder='document')"``) is parsed with ``ast`` and ``ast.literal_eval``.

As in BFCL, a held-out (``miss_func``) function is executable before it is offered: BFCL's
executor maps every public method of the involved classes, and at least one ground truth
(``multi_turn_miss_func_49``) calls ``tail`` two turns before it is offered.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import random
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from trajtune.plugins.bfcl.data import MULTI_TURN_CATEGORIES, load_bfcl_entry, record_ids, resolve_categories
from trajtune.envs.base import Environment, ResetResult, StepResult, Task
from trajtune.formats.bfcl import function_to_tool_spec
from trajtune.schema import Message, Outcome, ToolCall, ToolSpec, Trajectory

API_MODULE_PREFIX = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
API_MODULES = {
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}
STATELESS_CLASSES = ("MathAPI",)
#: BFCL's per-turn step limit (``MAXIMUM_STEP_LIMIT``); going over fails the episode.
MAX_STEPS_PER_TURN = 20
#: BFCL's user message for a turn that adds held-out functions.
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"
TURN_END_TEXT = "I have completed the request."
ASK_TEXT = "I cannot complete this request with the information and tools I have."


@lru_cache(maxsize=None)
def api_class(class_name: str) -> type:
    """Import one executable API class from the installed bfcl_eval (no other bfcl_eval code).

    These modules need only the standard library and ``mpmath`` (MathAPI); importing them does
    not import bfcl_eval's model handlers.
    """
    if class_name not in API_MODULES:
        raise ValueError(f"unknown BFCL API class {class_name!r}; known: {', '.join(API_MODULES)}")
    module = importlib.import_module(f"{API_MODULE_PREFIX}.{API_MODULES[class_name]}")
    cls = getattr(module, class_name)
    if not isinstance(cls, type):
        raise TypeError(f"{API_MODULE_PREFIX}.{API_MODULES[class_name]}.{class_name} is not a class")
    return cls


def make_instances(involved_classes: list[str], initial_config: dict[str, Any], long_context: bool) -> dict[str, Any]:
    """Fresh API instances loaded with the scenario, as BFCL's ``execute_multi_turn_func_call``."""
    out: dict[str, Any] = {}
    for name in involved_classes:
        inst = api_class(name)()
        if name not in STATELESS_CLASSES:
            inst._load_scenario(copy.deepcopy(initial_config.get(name, {})), long_context=long_context)
        out[name] = inst
    return out


def format_result(value: Any) -> str:
    """BFCL's rendering of a return value (strings as is, dicts as JSON, anything else ``str``)."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


class APIDispatcher:
    """Call API methods by name without ``eval``: an explicit allow-list of bound methods."""

    def __init__(self, instances: dict[str, Any], allowed: set[str]):
        self._methods: dict[str, Callable[..., Any]] = {}
        self._instances = instances
        self.allowed = set(allowed)
        for inst in instances.values():
            cls = type(inst)
            # Only plain functions defined on the API class itself (nothing inherited, no
            # attributes, no private names): exactly what the BFCL function docs describe.
            for name, fn in vars(cls).items():
                if name.startswith("_") or not inspect.isfunction(fn):
                    continue
                self._methods[name] = getattr(inst, name)

    def declared(self) -> set[str]:
        return set(self._methods)

    def method(self, name: str) -> Callable[..., Any] | None:
        if name not in self.allowed:
            return None
        return self._methods.get(name)

    def call(self, name: str, kwargs: dict[str, Any] | None, args: tuple[Any, ...] = ()) -> str:
        fn = self.method(name)
        if fn is None:
            if name in self._methods:
                return f"Error during execution: function {name!r} is not available right now"
            return f"Error during execution: unknown function {name!r}"
        if kwargs is None:
            return "Error during execution: arguments must be a JSON object"
        if not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
            return "Error during execution: argument names must be identifiers"
        try:
            return format_result(fn(*args, **copy.deepcopy(kwargs)))
        except Exception as e:  # noqa: BLE001 - BFCL turns any failure into an observation
            return f"Error during execution: {e}"


def parse_call_string(text: str) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """``"mv(source='a', destination='b')"`` -> ``("mv", (), {...})`` with ``ast``; never ``eval``.

    Only a plain function name and literal arguments are accepted.
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"not a call expression: {text!r} ({e.msg})") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain function call: {text!r}")
    try:
        args = tuple(ast.literal_eval(a) for a in node.args if not isinstance(a, ast.Starred))
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise ValueError("*args/**kwargs are not allowed")
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    except ValueError as e:
        raise ValueError(f"non-literal argument in {text!r}: {e}") from None
    return node.func.id, args, kwargs


def _jsonable(v: Any) -> Any:
    return json.loads(json.dumps(v))


def _compare_instances(model: Any, truth: Any) -> dict[str, Any]:
    """BFCL's ``_compare_instances``: public attributes of the ground-truth instance must match."""
    diffs: dict[str, Any] = {}
    for attr in vars(truth):
        if attr.startswith("_"):
            continue
        m, t = getattr(model, attr, None), getattr(truth, attr)
        if m != t:
            diffs[attr] = {"model": m, "ground_truth": t}
    return diffs


def _multiset_missing(needed: list[str], have: list[str]) -> list[str]:
    pool = list(have)
    missing = []
    for item in needed:
        try:
            pool.remove(item)
        except ValueError:
            missing.append(item)
    return missing


class BFCLMultiTurnEnv(Environment):
    """One BFCL multi-turn entry per episode. Only a ``test`` split exists (it is a benchmark)."""

    name = "bfcl_multi_turn"
    description = "BFCL multi-turn function calling over stateful simulated APIs (file system, trading, travel, ...)."
    # Assistant messages over the whole episode: BFCL allows 20 steps (+1 closing message) per
    # user turn, and entries have up to ~8 turns.
    max_turns = 200

    def __init__(self, categories: list[str] | tuple[str, ...] | str | None = None, limit: int | None = None,
                 max_steps_per_turn: int = MAX_STEPS_PER_TURN, trajectories: list[Trajectory] | None = None):
        cats = resolve_categories(categories or ["multi_turn"])
        bad = [c for c in cats if c not in MULTI_TURN_CATEGORIES]
        if bad:
            raise ValueError(f"{bad} are not multi-turn BFCL categories; use: {', '.join(MULTI_TURN_CATEGORIES)}")
        self.categories = cats
        self.limit = limit
        self.max_steps_per_turn = max_steps_per_turn
        self._given = {t.id: t for t in trajectories} if trajectories is not None else None
        self._ids: dict[str, str] | None = None  # record id -> category, in file order
        self._cache: dict[str, Trajectory] = {}
        self.traj: Trajectory | None = None
        self.task: Task | None = None

    # -- task list ------------------------------------------------------------------------

    def _all(self) -> dict[str, str]:
        """Entry id -> category (file order); entries are converted only when used."""
        if self._given is not None:
            return {i: t.reference.data["category"] for i, t in self._given.items()}
        if self._ids is None:
            self._ids = {i: cat for cat in self.categories for i in record_ids(cat, self.limit)}
        return self._ids

    def _trajectory(self, record_id: str) -> Trajectory | None:
        if self._given is not None:
            return self._given.get(record_id)
        cat = self._all().get(record_id)
        if cat is None:
            return None
        if record_id not in self._cache:
            self._cache[record_id] = load_bfcl_entry(cat, record_id)
        return self._cache[record_id]

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        """The first ``n`` entries in file order when ``seed == 0``, else a seeded sample (kept in
        file order). BFCL is an evaluation set: asking for ``train`` is an error, not a leak."""
        if split != "test":
            raise ValueError("BFCL has only a 'test' split (it is an evaluation benchmark); "
                             "train on other data and evaluate here")
        ids = self._all()
        items = list(ids)
        if n > len(items):
            raise ValueError(f"asked for {n} BFCL multi-turn tasks, only {len(items)} exist in {self.categories}")
        idx = list(range(len(items)))
        chosen = idx[:n] if seed == 0 else sorted(random.Random(seed).sample(idx, n))
        return [Task(id=items[i], seed=i, split="test", data={"record_id": items[i], "category": ids[items[i]]})
                for i in chosen]

    def splits(self) -> dict[str, int]:
        return {"test": len(self._all())}

    def all_tasks(self) -> list[Task]:
        """Every entry of the selected categories, in file order."""
        return self.tasks("test", len(self._all()))

    def task_for(self, record_id: str) -> Task:
        ids = self._all()
        if record_id not in ids:
            raise KeyError(f"no BFCL multi-turn entry {record_id!r} in {self.categories}")
        return Task(id=record_id, seed=list(ids).index(record_id), split="test",
                    data={"record_id": record_id, "category": ids[record_id]})

    # -- episode ------------------------------------------------------------------------

    def reset(self, task: Task) -> ResetResult:
        rid = task.data.get("record_id", task.id)
        traj = self._trajectory(rid)
        if traj is None:
            raise KeyError(f"no BFCL multi-turn entry {rid!r} in {self.categories}")
        self.task, self.traj = task, traj
        d = traj.reference.data
        self.turns: list[list[dict[str, Any]]] = d["turns"]
        self.ground_truth: list[list[str]] = d.get("ground_truth") or []
        if len(self.ground_truth) != len(self.turns):
            raise ValueError(f"{rid}: {len(self.turns)} turns but {len(self.ground_truth)} ground-truth turns")
        self.long_context = "long_context" in d["category"]
        classes, config = d["involved_classes"], d["initial_config"]
        self.model_instances = make_instances(classes, config, self.long_context)
        self.truth_instances = make_instances(classes, config, self.long_context)
        self.tools: list[ToolSpec] = [function_to_tool_spec(f) for f in d["functions"]]
        self.held: dict[str, list[dict[str, Any]]] = d.get("missed_function_docs") or {}
        # Every function of the entry is callable, held-out ones included (see module doc).
        all_names = {t.name for t in self.tools} | {f["name"] for fs in self.held.values() for f in fs}
        self.model_api = APIDispatcher(self.model_instances, all_names)
        self.truth_api = APIDispatcher(self.truth_instances, all_names)
        self.turn = 0
        self.steps_in_turn = 0
        self.turn_had_calls = False
        self.model_results: list[str] = []
        self.failure: dict[str, Any] | None = None
        self.turn_log: list[dict[str, Any]] = []
        self.finished = False
        self.force_quit = False
        msgs, _ = self._turn_messages(0)
        return ResetResult(messages=msgs, tools=list(self.tools))

    def _turn_messages(self, i: int) -> tuple[list[Message], list[ToolSpec] | None]:
        """Messages that open turn ``i``; for a held-out-function turn, also the new tool list."""
        added = self.held.get(str(i))
        if added:
            new_specs = [function_to_tool_spec(f) for f in added]
            self.tools.extend(new_specs)
            listing = json.dumps([s.to_openai()["function"] for s in new_specs], ensure_ascii=False)
            return [Message(role="user", content=f"{listing}\n{ADDED_FUNCTIONS_PROMPT}", origin="user")], list(self.tools)
        msgs = [Message(role=m.get("role", "user"), content=m.get("content", ""), origin="user")
                for m in self.turns[i]]
        return msgs, None

    def _execute(self, call: ToolCall) -> str:
        args = call.arguments
        if args is None and call.arguments_raw is not None:
            try:
                args = json.loads(call.arguments_raw)
            except json.JSONDecodeError:
                args = None
            if not isinstance(args, dict):
                args = None
        return self.model_api.call(call.name, args)

    def _check_turn(self) -> None:
        """Replay this turn's ground truth and apply BFCL's checks (first failure is kept)."""
        i = self.turn
        truth_results = []
        for s in self.ground_truth[i]:
            name, args, kwargs = parse_call_string(s)
            truth_results.append(self.truth_api.call(name, kwargs, args))
        entry: dict[str, Any] = {"turn": i, "ground_truth_calls": len(self.ground_truth[i])}
        if self.ground_truth[i] and self.failure is None:
            if not self.turn_had_calls:
                self.failure = {"turn": i, "error_type": "multi_turn:empty_turn_model_response",
                                "message": f"no tool call in turn {i}, which needs some"}
            else:
                for cls, truth in self.truth_instances.items():
                    diffs = _compare_instances(self.model_instances[cls], truth)
                    if diffs:
                        self.failure = {"turn": i, "error_type": "multi_turn:instance_state_mismatch",
                                        "message": f"{cls} state differs from the ground truth after turn {i}",
                                        "differences": sorted(diffs)}
                        break
                if self.failure is None:
                    missing = _multiset_missing(truth_results, self.model_results)
                    if missing:
                        self.failure = {"turn": i, "error_type": "multi_turn:execution_response_mismatch",
                                        "message": f"{len(missing)} ground-truth result(s) of turn {i} never "
                                                   f"appeared in the agent's results", "missing": missing[:5]}
        entry["passed_so_far"] = self.failure is None
        self.turn_log.append(entry)

    def step(self, action: Message) -> StepResult:
        if self.traj is None:
            raise RuntimeError("call reset() before step()")
        if self.finished:
            return StepResult(observations=[], reward=0.0, done=True, info={"error": "episode already over"})
        calls = action.tool_calls or []
        if calls:
            self.steps_in_turn += 1
            self.turn_had_calls = True
            obs = []
            for c in calls:
                result = self._execute(c)
                self.model_results.append(result)
                obs.append(Message(role="tool", tool_call_id=c.id, name=c.name, content=result, origin="environment"))
            if self.steps_in_turn > self.max_steps_per_turn:
                self.force_quit = True
                self.finished = True
                self.failure = self.failure or {"turn": self.turn, "error_type": "multi_turn:force_terminated",
                                                "message": f"more than {self.max_steps_per_turn} steps in turn {self.turn}"}
                return StepResult(observations=obs, reward=0.0, done=True, termination="max_turns",
                                  info={"success": False, "failure": self.failure})
            return StepResult(observations=obs, reward=0.0, done=False, info={"turn": self.turn})
        # No tool call: the agent ends this user turn.
        self._check_turn()
        self.turn += 1
        self.steps_in_turn = 0
        self.turn_had_calls = False
        if self.turn >= len(self.turns):
            self.finished = True
            ok = self.success()
            return StepResult(observations=[], reward=1.0 if ok else 0.0, done=True,
                              info={"success": ok, "failure": self.failure, "turns": self.turn_log})
        msgs, tools = self._turn_messages(self.turn)
        info: dict[str, Any] = {"turn": self.turn}
        if tools is not None:
            info["tools"] = tools
        return StepResult(observations=msgs, reward=0.0, done=False, info=info)

    def success(self) -> bool:
        return bool(self.traj is not None and self.finished and not self.force_quit and self.failure is None)

    def render(self) -> str:
        if self.traj is None:
            return "<bfcl_multi_turn: not started>"
        lines = [f"{self.traj.id}: turn {self.turn}/{len(self.turns)}, failure={self.failure}"]
        for cls, inst in self.model_instances.items():
            attrs = {k: v for k, v in vars(inst).items() if not k.startswith("_")}
            lines.append(f"{cls}: {str(attrs)[:400]}")
        return "\n".join(lines)

    # -- ground truth as a trajectory -----------------------------------------------------

    def ground_truth_kwargs(self, call_string: str) -> tuple[str, dict[str, Any]]:
        """A ground-truth call string as (name, JSON keyword arguments), binding positional
        arguments to parameter names with the method's signature."""
        name, args, kwargs = parse_call_string(call_string)
        fn = self.truth_api._methods.get(name)
        if fn is None:
            raise ValueError(f"ground truth calls unknown function {name!r}")
        bound = inspect.signature(fn).bind(*args, **kwargs)
        return name, _jsonable(dict(bound.arguments))

    def expert(self, task: Task) -> Trajectory:
        """Replay the ground truth through ``step`` (one call per assistant message, then a
        closing text message per turn), exactly as an agent would have to."""
        reset = self.reset(task)
        msgs = list(reset.messages)
        n = 0
        for i in range(len(self.turns)):
            gt = self.ground_truth[i]
            # One call per message, unless that would exceed the per-turn step limit (a few
            # long_context entries have more than 20 calls in a turn): then even chunks.
            size = -(-len(gt) // self.max_steps_per_turn) if gt else 1
            for c0 in range(0, len(gt), size):
                calls = []
                for s in gt[c0:c0 + size]:
                    name, kwargs = self.ground_truth_kwargs(s)
                    calls.append(ToolCall(id=f"call_{n:06d}", id_generated=True, name=name, arguments=kwargs))
                    n += 1
                m = Message(role="assistant", origin="agent", tool_calls=calls)
                msgs.append(m)
                msgs.extend(self.step(m).observations)
            closing = Message(role="assistant", origin="agent",
                              content=TURN_END_TEXT if self.ground_truth[i] else ASK_TEXT)
            msgs.append(closing)
            msgs.extend(self.step(closing).observations)
        ok = self.success()
        return Trajectory(
            id=task.id, messages=msgs, tools=list(self.tools), reward=1.0 if ok else 0.0,
            outcome=Outcome(success=ok, termination="done"),
            metadata={"env": self.name, "category": self.traj.reference.data["category"], "expert": True,
                      "failure": self.failure},
            reference=self.traj.reference, provenance=self.traj.provenance,
        )
