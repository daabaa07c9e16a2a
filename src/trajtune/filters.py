"""Data quality filters for agent trajectories (``trajtune data filter``, and ``data.filters`` in
SFT and RFT configs): stepwise consistency, mistakes, format, length and an LLM judge.

Why: agent logs and mined attempts hold records that teach the wrong thing: a call repeated
unchanged after it failed, an answer given on top of an error the agent never fixed, calls that do
not parse or break their tool's schema, runaway episodes. Skywork-R1V4 and AgentBank filter such
records before training; error-masked SFT (``data.mask_errors``) keeps them with the mistake's
weight at 0 instead. Each filter names the rule that removed a record, so a user sees how much of
the data went and why, and can read the removed records (``--rejected``).

Rules (a record is removed by the first rule it breaks, in this order):

- ``format`` (``format: true``): a validation error (``trajtune data validate``'s E-rules) or
  arguments that violate the called tool's JSON Schema (W223);
- ``repeat-failed-call`` (``consistency: true``): an assistant call identical (name and
  arguments) to an earlier call of the record whose tool result was an error;
- ``ends-on-error`` (``consistency: true``): the record's last tool result before its final answer
  is an error: the agent answered without recovering;
- ``mistake`` (``errors: true``): any error turn as error-masked SFT defines it (an invalid call,
  an error observation, a verifier flag);
- ``too-few-turns`` / ``too-many-turns`` (``min_turns`` / ``max_turns``: assistant turns);
- ``too-long`` (``max_chars``: characters of message text, tool calls included);
- ``judge`` (``judge``): an LLM judge's score under ``judge_min_score``. A judge that fails on a
  record (unreachable after the start, a reply without a score) keeps the record and is counted in
  ``judge_failures``: a failing judge never removes data and never stops the run.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trajtune.algorithms.error_mask import error_turns, observation_is_error
from trajtune.config import FilterSpec
from trajtune.schema import Trajectory

RULE_ORDER = ("format", "repeat-failed-call", "ends-on-error", "mistake", "too-few-turns", "too-many-turns",
              "too-long", "judge")


def _call_key(name: str, arguments: Any) -> str:
    return name + "\x00" + json.dumps(arguments, sort_keys=True, default=str)


def _results(traj: Trajectory, i: int) -> list[Any]:
    """The tool results (and environment notes) that answer assistant message ``i``."""
    msgs = traj.messages
    ids = {c.id for c in msgs[i].tool_calls or []}
    out = []
    j = i + 1
    while j < len(msgs) and msgs[j].role != "assistant":
        o = msgs[j]
        if (o.role == "tool" and (not ids or o.tool_call_id is None or o.tool_call_id in ids)) or \
                (o.role == "user" and o.origin == "environment"):
            out.append(o)
        j += 1
    return out


def consistency_issue(traj: Trajectory) -> tuple[str, str] | None:
    """(rule, detail) of the first stepwise inconsistency of ``traj``, or None."""
    failed: dict[str, int] = {}  # call key -> message index of the failed call
    last_result_failed: int | None = None
    final = max((k for k, x in enumerate(traj.messages) if x.role == "assistant"), default=-1)
    for i, m in enumerate(traj.messages):
        if m.role != "assistant":
            continue
        calls = m.tool_calls or []
        for c in calls:
            key = _call_key(c.name, c.arguments if c.arguments is not None else c.arguments_raw)
            if key in failed:
                return "repeat-failed-call", (f"messages[{i}] repeats {c.name} with the same arguments after it "
                                              f"failed at messages[{failed[key]}]")
        results = _results(traj, i)
        if calls:
            bad = any(observation_is_error(o) for o in results)
            if bad:
                for c in calls:
                    failed[_call_key(c.name, c.arguments if c.arguments is not None else c.arguments_raw)] = i
            last_result_failed = i if bad else None
        elif last_result_failed is not None and i == final:
            return "ends-on-error", (f"the final answer (messages[{i}]) follows a failed call at "
                                     f"messages[{last_result_failed}] that was never recovered")
    return None


def _format_issue(traj: Trajectory) -> tuple[str, str] | None:
    from trajtune.validate import validate_trajectory

    for f in validate_trajectory(traj, sft=False):
        if f.severity == "E" or f.rule == "W223":
            return "format", f"{f.rule} {f.name}: {f.message}"
    return None


def _n_turns(traj: Trajectory) -> int:
    return sum(1 for m in traj.messages if m.role == "assistant")


def _n_chars(traj: Trajectory) -> int:
    n = 0
    for m in traj.messages:
        n += len(m.text())
        for c in m.tool_calls or []:
            n += len(c.name) + len(json.dumps(c.arguments, default=str) if c.arguments is not None
                                   else c.arguments_raw or "")
    return n


def rule_issue(traj: Trajectory, spec: FilterSpec) -> tuple[str, str] | None:
    """The first rule ``traj`` breaks among the non-judge filters of ``spec`` (see the module docstring)."""
    if spec.format and (issue := _format_issue(traj)):
        return issue
    if spec.consistency and (issue := consistency_issue(traj)):
        return issue
    if spec.errors and (errs := error_turns(traj)):
        i, why = next(iter(errs.items()))
        return "mistake", f"messages[{i}]: {why}" + (f" (+{len(errs) - 1} more)" if len(errs) > 1 else "")
    n = _n_turns(traj)
    if spec.min_turns and n < spec.min_turns:
        return "too-few-turns", f"{n} assistant turn(s) < min_turns {spec.min_turns}"
    if spec.max_turns and n > spec.max_turns:
        return "too-many-turns", f"{n} assistant turns > max_turns {spec.max_turns}"
    if spec.max_chars and (c := _n_chars(traj)) > spec.max_chars:
        return "too-long", f"{c} characters > max_chars {spec.max_chars}"
    return None


@dataclass
class FilterReport:
    """What a filter pass kept and removed, by rule."""

    kept: int = 0
    removed: Counter = field(default_factory=Counter)
    judge_failures: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"kept": self.kept, "removed": sum(self.removed.values()),
                "removed_by_rule": {r: self.removed[r] for r in RULE_ORDER if self.removed.get(r)},
                **({"judge_failures": self.judge_failures} if self.judge_failures else {})}


def make_filter_judge(spec: FilterSpec) -> Any:
    """The judge of ``spec`` (None without one); an endpoint that cannot be reached is refused here,
    before any record is read."""
    if spec.judge is None:
        return None
    from trajtune.judge import make_judge

    return make_judge(spec.judge, model=spec.judge_model, rubric=spec.judge_rubric, workers=1)


def judge_issue(traj: Trajectory, judge: Any, spec: FilterSpec) -> tuple[tuple[str, str] | None, bool]:
    """(the judge rule's issue or None, whether the judge failed on this record)."""
    try:
        verdict = judge.verdict(traj)
    except Exception:  # noqa: BLE001 - a failing judge keeps the record and is counted, never fatal
        return None, True
    score = verdict.get("score")
    if score is None:
        return None, True
    if float(score) < spec.judge_min_score:
        return ("judge", f"score {score:g} < judge_min_score {spec.judge_min_score:g}: "
                         f"{str(verdict.get('reason', ''))[:200]}"), False
    return None, False


def apply_filters(trajs: Iterable[Trajectory], spec: FilterSpec, judge: Any = None,
                  on_removed: Any = None) -> tuple[list[Trajectory], FilterReport]:
    """The records ``spec`` keeps, in order, and the report. ``on_removed(traj, rule, detail)`` sees
    each removed record (the CLI writes them to ``--rejected``)."""
    report = FilterReport()
    kept: list[Trajectory] = []
    for t in trajs:
        issue = rule_issue(t, spec)
        if issue is None and judge is not None:
            issue, failed = judge_issue(t, judge, spec)
            report.judge_failures += failed
        if issue is None:
            kept.append(t)
            continue
        report.removed[issue[0]] += 1
        if on_removed is not None:
            on_removed(t, *issue)
    report.kept = len(kept)
    return kept, report
