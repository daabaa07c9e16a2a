"""Run a model on BFCL categories and build the per-category report.

The model is any ``generate_fn(messages, tools) -> str`` (so an HF model, a vLLM server or a
test double all fit); its text is parsed into tool calls by ``parse_fn`` (default: trajtune's
Hermes parser, ``parse_tool_calls(text, "hermes")``) and scored:

- AST categories by ``check_ast`` (a parse error is a format error and fails the item, as a
  BFCL decode failure does);
- relevance categories by ``check_relevance`` (a parse failure counts as "no call", as in BFCL);
- multi-turn categories by running ``BFCLMultiTurnEnv`` to the end (a message with a parse
  error executes nothing and ends the turn, as a BFCL decode failure does).

``run_bfcl`` returns ``bfcl_report(results)``; ``on_result`` receives every item as it finishes
(for streaming to JSONL) and ``skip_ids`` lets an interrupted run resume.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from trajtune.chat.parsers import assistant_message, parse_tool_calls
from trajtune.plugins.bfcl.ast_checker import check_ast, check_relevance
from trajtune.plugins.bfcl.data import (
    AST_CATEGORIES,
    MULTI_TURN_CATEGORIES,
    RELEVANCE_CATEGORIES,
    load_bfcl,
    resolve_categories,
)
from trajtune.plugins.bfcl.multi_turn import BFCLMultiTurnEnv
from trajtune.schema import Message, Outcome, ToolCall, ToolSpec, Trajectory

GenerateFn = Callable[[list[Message], list[ToolSpec]], str]


@dataclass
class Parsed:
    content: str
    tool_calls: list[ToolCall]
    errors: list[str] = field(default_factory=list)


ParseFn = Callable[[str], Any]


@dataclass
class BFCLItemResult:
    """One scored BFCL entry (JSON-serialisable through ``as_dict``)."""

    id: str
    category: str
    valid: bool
    reason: str
    message: str = ""
    format_errors: int = 0
    n_calls: int = 0
    turns: int = 1
    trajectory: Trajectory | None = None

    def as_dict(self) -> dict[str, Any]:
        """The scalar fields. Not ``dataclasses.asdict``: that deep-copies the trajectory too (only to
        drop it), which raises RecursionError on a model answer with deeply nested arguments."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "trajectory"}


def default_parse_fn(parser: str = "hermes") -> Callable[[str], Parsed]:
    """trajtune's registered tool-call parser (``trajtune.chat.parsers``) as a ``parse_fn``."""
    def parse(text: str) -> Parsed:
        r = parse_tool_calls(text, parser)
        return Parsed(r.content, list(r.tool_calls), list(r.errors))

    return parse


def _coerce_parsed(out: Any, text: str) -> Parsed:
    """Accept a ParseResult-like object, a ``(calls, errors)`` pair, or a plain list of calls."""
    if isinstance(out, Parsed):
        return out
    if hasattr(out, "tool_calls"):
        return Parsed(getattr(out, "content", text) or "", list(out.tool_calls or []), list(getattr(out, "errors", []) or []))
    if isinstance(out, tuple) and len(out) == 2:
        calls, errors = out
        return Parsed(text, _as_tool_calls(calls), list(errors or []))
    if isinstance(out, list):
        return Parsed(text, _as_tool_calls(out), [])
    raise TypeError(f"parse_fn returned {type(out).__name__}; expected a ParseResult, (calls, errors) or a list of calls")


def _as_tool_calls(calls: Iterable[Any]) -> list[ToolCall]:
    out = []
    for i, c in enumerate(calls):
        if isinstance(c, ToolCall):
            out.append(c)
        elif isinstance(c, Mapping):
            out.append(ToolCall(id=str(c.get("id") or f"call_{i:06d}"), id_generated=not c.get("id"),
                                name=str(c.get("name")), arguments=c.get("arguments")))
        else:
            raise TypeError(f"call {i}: expected a ToolCall or dict, got {type(c).__name__}")
    return out


def _parse(parse_fn: ParseFn, text: str) -> Parsed:
    try:
        return _coerce_parsed(parse_fn(text), text)
    except ValueError as e:  # a parse_fn that raises on bad text: a format error, not a crash
        return Parsed(text, [], [str(e)])


def _assistant(p: Parsed, keep_calls: bool, raw: str) -> Message:
    return assistant_message(p.content, p.tool_calls if keep_calls else None, p.errors, raw)


def check_entry(data: dict[str, Any], calls: list[ToolCall], errors: list[Any]) -> tuple[bool, str, str]:
    """BFCL's verdict on one single-turn answer (``data``: an entry's ``reference.data``): (valid,
    reason, message). A call that did not parse is a format error, except in the relevance
    categories, where no call at all may be the right answer."""
    cat = data["category"]
    if cat in RELEVANCE_CATEGORIES:
        r = check_relevance(None if errors and not calls else calls, cat)
    elif errors:
        r = None
    else:
        r = check_ast(data["functions"], calls, data["ground_truth"], cat)
    return (False, "format_error", "; ".join(map(str, errors))) if r is None else r.as_tuple()


def score_single_turn(traj: Trajectory, text: str, parse_fn: ParseFn) -> BFCLItemResult:
    """Parse one model answer to a single-turn BFCL entry and score it."""
    data = traj.reference.data
    cat = data["category"]
    p = _parse(parse_fn, text)
    valid, reason, message = check_entry(data, p.tool_calls, p.errors)
    out_traj = traj.model_copy(deep=True)
    out_traj.messages.append(_assistant(p, keep_calls=True, raw=text))
    out_traj.reward = 1.0 if valid else 0.0
    out_traj.outcome = Outcome(success=valid, termination="done")
    out_traj.metadata = {**out_traj.metadata, "bfcl_reason": reason, "bfcl_message": message,
                         "format_errors": len(p.errors)}
    return BFCLItemResult(id=traj.id, category=cat, valid=valid, reason=reason, message=message,
                          format_errors=len(p.errors), n_calls=len(p.tool_calls), trajectory=out_traj)


def run_multi_turn_episode(env: Any, task: Any, generate_fn: GenerateFn, parse_fn: ParseFn) -> BFCLItemResult:
    """Drive one ``BFCLMultiTurnEnv`` episode with the model until the environment ends it."""
    reset = env.reset(task)
    messages = list(reset.messages)
    tools = list(reset.tools)
    format_errors = 0
    n_calls = 0
    termination = "done"
    taken: set[str] = set()
    for _ in range(env.max_turns):
        text = generate_fn(messages, tools)
        p = _parse(parse_fn, text)
        format_errors += len(p.errors)
        # Unique call ids over the episode (tool messages answer them).
        for c in p.tool_calls:
            if not c.id or c.id in taken:
                k = len(taken)
                while f"call_{k:06d}" in taken:
                    k += 1
                c.id, c.id_generated = f"call_{k:06d}", True
            taken.add(c.id)
        msg = _assistant(p, keep_calls=not p.errors, raw=text)
        n_calls += len(msg.tool_calls or [])
        messages.append(msg)
        res = env.step(msg)
        messages.extend(res.observations)
        if res.info.get("tools") is not None:
            tools = list(res.info["tools"])
        if res.done:
            termination = res.termination or "done"
            break
    else:
        termination = "max_turns"
    valid = bool(env.success()) if termination == "done" else False
    failure = env.failure or ({} if valid else {"error_type": "multi_turn:max_turns", "message": "episode cap reached"})
    reason = "ok" if valid else str(failure.get("error_type", "multi_turn:failed"))
    traj = Trajectory(id=task.id, messages=messages, tools=tools, reward=1.0 if valid else 0.0,
                      outcome=Outcome(success=valid, termination=termination),
                      metadata={"bfcl_category": env.traj.reference.data["category"], "bfcl_reason": reason,
                                "bfcl_failure": failure, "format_errors": format_errors},
                      reference=env.traj.reference, provenance=env.traj.provenance)
    return BFCLItemResult(id=task.id, category=env.traj.reference.data["category"], valid=valid, reason=reason,
                          message=str(failure.get("message", "")), format_errors=format_errors, n_calls=n_calls,
                          turns=len(env.turns), trajectory=traj)


def run_bfcl(generate_fn: GenerateFn, categories: Sequence[str] | str | None = None, limit: int | None = None,
             *, parse_fn: ParseFn | None = None, parser: str = "hermes",
             on_result: Callable[[BFCLItemResult], None] | None = None,
             skip_ids: set[str] | None = None, previous: Iterable[BFCLItemResult | Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Score ``generate_fn`` on BFCL ``categories`` (names, aliases or groups; default all
    supported). ``limit`` caps entries per category. Items in ``skip_ids`` are not run again;
    pass their earlier results as ``previous`` so the report still counts them."""
    parse = parse_fn or default_parse_fn(parser)
    skip = skip_ids or set()
    results: list[BFCLItemResult | Mapping[str, Any]] = list(previous)
    for cat in resolve_categories(categories):
        if cat in MULTI_TURN_CATEGORIES:
            env = BFCLMultiTurnEnv([cat], limit=limit)
            for task in env.all_tasks():
                if task.id in skip:
                    continue
                r = run_multi_turn_episode(env, task, generate_fn, parse)
                results.append(r)
                if on_result:
                    on_result(r)
            continue
        assert cat in AST_CATEGORIES or cat in RELEVANCE_CATEGORIES
        for traj in load_bfcl(cat, limit=limit):
            if traj.id in skip:
                continue
            text = generate_fn(list(traj.messages), list(traj.tools))
            r = score_single_turn(traj, text, parse)
            results.append(r)
            if on_result:
                on_result(r)
    return bfcl_report(results)


def bfcl_report(results: Iterable[BFCLItemResult | Mapping[str, Any]]) -> dict[str, Any]:
    """Per-category accuracy, format errors and failure reasons, plus overall numbers.

    ``overall.accuracy`` is over all items; ``overall.category_mean`` is the unweighted mean
    of category accuracies (closer to how BFCL averages); groups (non_live, live, multi_turn,
    relevance) are unweighted means over the categories present.
    """
    per: dict[str, dict[str, Any]] = {}
    reasons: dict[str, Counter[str]] = {}
    for r in results:
        d = r.as_dict() if isinstance(r, BFCLItemResult) else dict(r)
        cat = d["category"]
        c = per.setdefault(cat, {"count": 0, "correct": 0, "format_errors": 0, "items_with_format_errors": 0,
                                 "calls": 0})
        c["count"] += 1
        c["correct"] += int(bool(d["valid"]))
        c["format_errors"] += int(d.get("format_errors", 0))
        c["items_with_format_errors"] += int(d.get("format_errors", 0) > 0)
        c["calls"] += int(d.get("n_calls", 0))
        reasons.setdefault(cat, Counter())[d["reason"]] += 1
    categories: dict[str, Any] = {}
    for cat in sorted(per):
        c = per[cat]
        n = c["count"]
        categories[cat] = {
            "count": n, "correct": c["correct"], "accuracy": c["correct"] / n if n else 0.0,
            "format_errors": c["format_errors"],
            "format_error_rate": c["items_with_format_errors"] / n if n else 0.0,
            "mean_calls": c["calls"] / n if n else 0.0,
            "reasons": dict(sorted(reasons[cat].items())),
        }
    total = sum(c["count"] for c in per.values())
    correct = sum(c["correct"] for c in per.values())

    def group_mean(names: Iterable[str]) -> float | None:
        accs = [categories[n]["accuracy"] for n in names if n in categories]
        return sum(accs) / len(accs) if accs else None

    groups = {
        "non_live_ast": group_mean(c for c in AST_CATEGORIES if not c.startswith("live_")),
        "live_ast": group_mean(c for c in AST_CATEGORIES if c.startswith("live_")),
        "relevance": group_mean(RELEVANCE_CATEGORIES),
        "multi_turn": group_mean(MULTI_TURN_CATEGORIES),
    }
    return {
        "benchmark": "bfcl",
        "overall": {
            "count": total, "correct": correct, "accuracy": correct / total if total else 0.0,
            "category_mean": group_mean(categories),
            "format_error_rate": (sum(c["items_with_format_errors"] for c in per.values()) / total) if total else 0.0,
        },
        "groups": {k: v for k, v in groups.items() if v is not None},
        "categories": categories,
    }
