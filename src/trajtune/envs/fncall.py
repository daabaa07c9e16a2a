"""``fncall``: call the right function with the right arguments, over randomised tool schemas.

Why this environment: a model fine-tuned on one world's five tools learns those tools, not tool
calling. Here every task draws a fresh schema for its function (name variant, parameter names,
descriptions, enum subsets) from a broad vocabulary (26 domains, ~250 function concepts, ~375
parameter concepts; see ``fncall_vocab``), plus 0-3 distractor functions, often of the same
domain, and a user request phrased in one of many ways that states every argument value
exactly (``fncall_gen``). The shape is that of single-call function-calling benchmarks: one
request, one correct call.

Episode (multi-turn, the default): the agent's first turn must be exactly one call. A correct
call is answered with a deterministic synthetic result (JSON, a function of the call) and the
agent then replies in text, which ends the episode; the final answer is **not** scored. A wrong
call (or a text reply, or several calls) ends the episode at once, with an ``Error: ...`` tool
message naming what was wrong. With ``single_turn: true`` the episode ends right after the call,
with no tool result (the expert trajectory then ends with the assistant's call).

Success = the call was correct. Reward: 1.0 on the call turn when correct, else 0 (so
``Trajectory.reward`` is 1 or 0). The verdict (``correct``, ``no_call``, ``multiple_calls``,
``format_error``, ``wrong_name``, ``missing_param``, ``extra_param``, ``wrong_type``,
``wrong_value``) is in ``StepResult.info["call_check"]`` and in ``render()``. The call turn also
reports the call scored by parts in ``info["reward_terms"]`` (``call_format``, ``call_name``,
``call_required``, ``call_types``, ``call_values``; see ``call_terms``), which an RL config can
weigh as ``rl.reward.terms: {info.call_values: 1.0, ...}``.

The check is AST-style: the right function name, every required parameter, JSON types as the
schema says (an integer is accepted where a number is expected, a float never where an integer
is), values equal (strings compared without case and punctuation, lists in order), no parameter
the schema lacks, and an optional parameter the request did not mention either left out or given
its default.

Options (``make_env("fncall", **options)``, ``--env-arg key=value``): ``single_turn``,
``min_distractors``/``max_distractors`` (0-3 by default), ``same_domain`` (chance that each
distractor comes from the target's domain), ``holdout``: ``none`` (train and test differ only by
task seed), ``functions`` (a fixed fifth of the function concepts, in every domain, appear only
in test tasks) or ``domains`` (whole domains appear only in test tasks); with a holdout, train
tasks never show a held-out function's name, even as a distractor.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from random import Random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trajtune.envs.base import Environment, ResetResult, StepResult, Task, parse_env_options
from trajtune.envs.fncall_gen import build_task, function_pool, join_and, snake
from trajtune.envs.fncall_vocab import RESULT_POOLS
from trajtune.envs.runner import run_episode
from trajtune.envs.toolenv import make_tasks
from trajtune.envs.tools import tool_message
from trajtune.schema import Message, ToolCall, ToolSpec, Trajectory


class FncallOptions(BaseModel):
    """Options of the ``fncall`` environment."""

    model_config = ConfigDict(extra="forbid")

    single_turn: bool = Field(False, description="End the episode right after the call (no tool result, no answer).")
    min_distractors: int = Field(0, ge=0, le=5, description="Fewest extra functions offered besides the right one.")
    max_distractors: int = Field(3, ge=0, le=5, description="Most extra functions offered besides the right one.")
    same_domain: float = Field(0.5, ge=0.0, le=1.0,
                               description="Chance that each distractor comes from the target's domain.")
    holdout: Literal["none", "functions", "domains"] = Field(
        "none", description="Keep some functions (or whole domains) for test tasks only.")
    system_prompt: bool = Field(True, description="Open with a system instruction (false: the user's request "
                                "and the tools only, as single-turn function-calling benchmarks prompt).")

    @model_validator(mode="after")
    def _range(self) -> FncallOptions:
        if self.min_distractors > self.max_distractors:
            raise ValueError(f"min_distractors ({self.min_distractors}) is above "
                             f"max_distractors ({self.max_distractors})")
        return self


# ---------------------------------------------------------------------------------------------
# The call check


@dataclass(frozen=True)
class Verdict:
    kind: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.kind == "correct"


def normalize_text(s: str) -> str:
    """Case- and punctuation-insensitive form of a string value."""
    return re.sub(r"[\W_]+", "", s.lower())


def _type_ok(jtype: str | None, value: Any) -> bool:
    if isinstance(value, bool):
        return jtype == "boolean"
    return {"integer": isinstance(value, int), "number": isinstance(value, (int, float)),
            "string": isinstance(value, str), "boolean": False, "array": isinstance(value, list)
            }.get(jtype or "", True)


def check_value(schema: dict[str, Any], got: Any, want: Any, where: str) -> Verdict | None:
    """None when ``got`` matches ``want`` under ``schema``, else the verdict saying why not."""
    jtype = schema.get("type")
    if not _type_ok(jtype, got):
        return Verdict("wrong_type", f"{where} must be {jtype}, got {type(got).__name__} {got!r}")
    if jtype == "array":
        if len(got) != len(want):
            return Verdict("wrong_value", f"{where} has {len(got)} items, expected {len(want)}")
        for i, (g, w) in enumerate(zip(got, want)):
            bad = check_value(schema.get("items", {}), g, w, f"{where}[{i}]")
            if bad:
                return bad
        return None
    if jtype == "string":
        if "enum" in schema and normalize_text(got) not in {normalize_text(o) for o in schema["enum"]}:
            return Verdict("wrong_value", f"{where} = {got!r} is not one of {schema['enum']}")
        same = normalize_text(got) == normalize_text(want)
    elif jtype == "number":
        same = float(got) == float(want)
    else:
        same = got == want
    return None if same else Verdict("wrong_value", f"{where} = {got!r}, expected {want!r}")


def _arguments(call: ToolCall) -> dict[str, Any] | None:
    if call.arguments is not None:
        return call.arguments
    try:
        parsed = json.loads(call.arguments_raw or "")
    except json.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def check_call(call: ToolCall, target: dict[str, Any], schema: dict[str, Any]) -> Verdict:
    """Check one call against the task's target (name, expected arguments, defaults) and its schema."""
    if call.name != target["name"]:
        return Verdict("wrong_name", f"called {call.name!r}, expected {target['name']!r}")
    args = _arguments(call)
    if args is None:
        return Verdict("format_error", f"arguments of {call.name} are not a JSON object")
    props = schema.get("properties", {})
    extra = sorted(set(args) - set(props))
    if extra:
        return Verdict("extra_param", f"{call.name} has no parameter {', '.join(map(repr, extra))}")
    for name, want in target["arguments"].items():
        if name not in args:
            return Verdict("missing_param", f"{name!r} is missing")
        bad = check_value(props[name], args[name], want, repr(name))
        if bad:
            return bad
    for name in sorted(set(args) - set(target["arguments"])):
        bad = check_value(props[name], args[name], target["defaults"][name], f"optional {name!r} (not asked for)")
        if bad:
            return bad
    return Verdict("correct")


def _fraction(hits: int, total: int) -> float:
    return 1.0 if total == 0 else hits / total


def call_terms(action: Message, target: dict[str, Any], schema: dict[str, Any]) -> dict[str, float]:
    """The call scored by parts, each in [0, 1] (ToolRL-style decomposed reward).

    Why: the pass/fail verdict gives a model that writes an almost-right call the same 0 as one
    that writes prose; the parts tell RL which of its calls were closer. With anything but exactly
    one call every part is 0. ``call_format``: its arguments are a JSON object; ``call_name``: the
    right function; then, for the right function with parsed arguments (else 0): ``call_required``
    the share of the schema's required parameters present, ``call_types`` the share of the given
    arguments whose JSON type the schema accepts (a parameter the schema lacks counts as wrong;
    no argument given scores 1 only when none is expected), ``call_values`` the share of right
    values over the expected arguments and any other argument given (an unasked optional one is
    right only at its default)."""
    zero = {"call_format": 0.0, "call_name": 0.0, "call_required": 0.0, "call_types": 0.0, "call_values": 0.0}
    calls = action.tool_calls or []
    if len(calls) != 1:
        return zero
    call = calls[0]
    args = _arguments(call)
    out = {**zero, "call_format": float(args is not None), "call_name": float(call.name == target["name"])}
    if args is None or call.name != target["name"]:
        return out
    props = schema.get("properties", {})
    required = list(schema.get("required", []))
    out["call_required"] = _fraction(sum(1 for r in required if r in args), len(required))
    typed = sum(1 for k, v in args.items() if k in props and _type_ok(props[k].get("type"), v))
    out["call_types"] = typed / len(args) if args else float(not target["arguments"])
    want = target["arguments"]
    keys = list(want) + [k for k in args if k not in want]
    known = {**target["defaults"], **want}  # the value each parameter should have, if given
    right = sum(1 for k in keys if k in args and k in props and k in known
                and check_value(props[k], args[k], known[k], repr(k)) is None)
    out["call_values"] = _fraction(right, len(keys))
    return out


def check_action(action: Message, target: dict[str, Any], schema: dict[str, Any]) -> Verdict:
    calls = action.tool_calls or []
    if not calls:
        return Verdict("no_call", "the reply has no function call")
    if len(calls) > 1:
        return Verdict("multiple_calls", f"{len(calls)} calls in one reply; exactly one is expected")
    return check_call(calls[0], target, schema)


# ---------------------------------------------------------------------------------------------
# Synthetic results and the expert's answer


def synthetic_result(name: str, arguments: dict[str, Any], result: dict[str, str]) -> dict[str, Any]:
    """A deterministic result for a call: the same call always gets the same value."""
    digest = hashlib.sha256(json.dumps([name, arguments], sort_keys=True).encode()).hexdigest()
    rng = Random(int(digest[:16], 16))
    kind, _, pool = result["kind"].partition(":")
    if kind == "number":
        return {snake(result["noun"]) or "result": round(rng.uniform(0.5, 5000), 2)}
    if kind == "integer":
        return {snake(result["noun"]) or "result": rng.randint(0, 5000)}
    if kind == "bool":
        return {"result": rng.random() < 0.5}
    if kind == "text":
        return {"result": rng.choice(RESULT_POOLS[pool])}
    k = rng.randint(2, 3)
    if pool == "integers":
        return {"results": sorted(rng.sample(range(1, 100), k))}
    if pool == "decimals":
        return {"results": [round(rng.uniform(-10, 10), 2) for _ in range(k)]}
    return {"results": rng.sample(RESULT_POOLS[pool], k)}


def final_answer(observation: str, result: dict[str, str]) -> str:
    """The expert's short reply, read off the tool result it was shown."""
    value = next(iter(json.loads(observation).values()))
    noun = result["noun"]
    if isinstance(value, bool):
        return "Yes." if value else "No."
    if isinstance(value, list):
        return f"Here is what I found: {join_and([str(v) for v in value], Random(0))}."
    if result["family"] in ("make", "book"):
        return f"Done. Your {noun} is ready: {value}."
    if result["family"] == "convert":
        return f"The result is {value}."
    return f"The {noun} is {value}."


# ---------------------------------------------------------------------------------------------
# The environment


class FncallEnv(Environment):
    """One request, 1-4 randomised functions, one correct call (see the module docstring)."""

    name = "fncall"
    description = ("Function calling over randomised schemas (26 domains, 0-3 distractors): make the one correct call; "
                   "options single_turn, holdout, min/max_distractors, same_domain.")
    max_turns = 3
    deterministic = True  # results are a function of the call
    options_model = FncallOptions  # `trajtune envs show` lists its fields: the keywords are not in the signature
    reward_terms = ("call_format", "call_name", "call_required", "call_types", "call_values")

    def __init__(self, **options: Any) -> None:
        self.options = parse_env_options(FncallOptions, "fncall", options)
        self.task: Task | None = None
        self.verdict: Verdict | None = None
        self.answered = False

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        o = self.options
        pool = function_pool(split, o.holdout)
        return make_tasks("fncall", split, n, seed, lambda rng: build_task(
            rng, pool, n_distractors=(o.min_distractors, o.max_distractors), same_domain=o.same_domain,
            single_turn=o.single_turn))

    def reset(self, task: Task) -> ResetResult:
        self.task, self.verdict, self.answered = task, None, False
        d = task.data
        system = [Message(role="system", content=d["system"], origin="system")] if self.options.system_prompt else []
        return ResetResult(messages=system + [Message(role="user", content=d["prompt"], origin="user")],
                           tools=[ToolSpec(**t) for t in d["tools"]])

    @property
    def _target_schema(self) -> dict[str, Any]:
        assert self.task is not None
        name = self.task.data["target"]["name"]
        return next(t["parameters"] for t in self.task.data["tools"] if t["name"] == name)

    def step(self, action: Message) -> StepResult:
        if self.task is None:
            raise RuntimeError("step() before reset()")
        if self.verdict is None:
            return self._judge(action)
        calls = action.tool_calls or []
        if calls:  # calls after the result: answered with an error, the episode goes on (max_turns ends it)
            return StepResult([tool_message(c.id, c.name, "Error: you already have the result; answer the user.")
                               for c in calls], info={"call_check": self.verdict.kind})
        self.answered = True
        return StepResult([], done=True, info={"success": self.success(), "call_check": self.verdict.kind})

    def _judge(self, action: Message) -> StepResult:
        assert self.task is not None
        d = self.task.data
        self.verdict = v = check_action(action, d["target"], self._target_schema)
        reward = 1.0 if v.ok else 0.0
        info = {"call_check": v.kind, "detail": v.detail, "success": v.ok,
                "reward_terms": call_terms(action, d["target"], self._target_schema)}
        if self.options.single_turn:
            return StepResult([], reward=reward, done=True, info=info)
        calls = action.tool_calls or []
        if not v.ok:
            return StepResult([tool_message(c.id, c.name, f"Error: {v.detail}") for c in calls],
                              reward=0.0, done=True, info=info)
        c = calls[0]
        out = synthetic_result(c.name, c.arguments or {}, d["result"])
        return StepResult([tool_message(c.id, c.name, json.dumps(out))], reward=reward, info=info)

    def success(self) -> bool:
        return self.verdict is not None and self.verdict.ok

    def expert(self, task: Task) -> Trajectory:
        """The expert calls the target with the request's values, then reads the result back to the user."""
        target = task.data["target"]

        def policy(messages: list[Message], tools: list[ToolSpec]) -> Message:
            if messages[-1].role == "user":
                call = ToolCall(id="", name=target["name"], arguments=dict(target["arguments"]))
                return Message(role="assistant", tool_calls=[call])
            return Message(role="assistant", content=final_answer(messages[-1].text(), task.data["result"]))

        traj = run_episode(self, task, policy)
        traj.metadata.update({"expert": True, "policy": f"expert:{self.name}",
                              "call_check": self.verdict.kind if self.verdict else None,
                              "function": task.data["function"], "domain": task.data["domain"],
                              "single_turn": self.options.single_turn})
        return traj

    def render(self) -> str:
        if self.task is None:
            return "[fncall] no task"
        d = self.task.data
        v = self.verdict
        verdict = "-" if v is None else v.kind + (f": {v.detail}" if v.detail else "")
        return "\n".join([f"request: {d['prompt']}",
                          f"expected: {d['target']['name']}({json.dumps(d['target']['arguments'])})",
                          f"tools: {', '.join(t['name'] for t in d['tools'])}",
                          f"call: {verdict}"])
