"""Agent metrics over episodes: success, pass@k, reward, format errors, tool-call accuracy, turns.

Every number is computed from the IR trajectory alone (plus ``metadata["eval"]`` written by the
harness), so a resumed evaluation that reads its episodes back from JSONL scores them exactly as
the run that produced them did.

Definitions (per episode unless said otherwise; aggregates are means over episodes):

- ``success``: ``outcome.success`` is true (decided by the environment on its state, or by the
  BFCL checker).
- ``pass@k``: the unbiased estimator of Chen et al. (2021), ``1 - C(n-c, k) / C(n, k)`` for a task
  with ``n`` samples of which ``c`` succeeded, averaged over tasks. Only reported for ``k <= n``.
- ``mean_reward``: ``Trajectory.reward`` (the undiscounted return).
- ``format_error_rate``: the fraction of assistant turns whose text failed to parse into tool
  calls (``Message.extra["parse_errors"]`` non-empty). ``format_errors`` is the total number of
  parse errors and ``episodes_with_format_errors`` the fraction of episodes with at least one.
- ``tool_call_accuracy``: valid tool calls / attempted tool calls. An *attempted* call is either
  a parsed ``ToolCall`` of an agent message or a parse error (each parse error is counted as one
  call that failed to parse). A call is *valid* when it parsed, names a tool in the trajectory's
  tool list and its arguments validate against that tool's ``parameters`` JSON Schema
  (``jsonschema``, the schema's own draft, default 2020-12; extra arguments are allowed unless the
  schema says ``additionalProperties: false``). When the harness records a checker verdict
  instead (``metadata["eval"]["tool_calls"]``, e.g. BFCL single-turn: one unit per item, valid
  when the AST checker accepts the answer), that verdict is used. ``None`` when nothing was
  attempted.
- ``mean_turns``: assistant messages per episode.
- ``retry`` (only for episodes of the ``retry`` wrapper, whose added messages carry
  ``extra["retry"]``): ``first_attempt_success`` (solved without a retry), ``success_by_attempt``
  (solved within 1, 2, ... attempts; the last equals ``success``), ``retried`` (episodes that got a
  second attempt), ``recovered`` (of those, the share solved in the end), ``reflections`` (reflection
  turns asked for) and, with ``inject_error``, ``injected_errors`` and ``recovery_after_error`` (the
  share of those episodes solved in the end).
- ``judge`` (only when ``--judge`` scored the episodes; ``trajtune.judge``): ``episodes`` judged,
  ``scored`` (replies with a score), ``parse_failures`` (replies without one: counted, never
  dropped) and ``mean_score`` over the scored ones (``None`` when none was).

Safety (``safety_summary``, over episodes of the ``safety`` environment, whose verdict the harness
records in ``metadata["safety"]``; each rate is ``None`` when its half has no episode):

- ``harmful_compliance``: harmful episodes in which a harmful target call was executed / harmful episodes;
- ``refusal_rate``: harmful episodes the agent refused (no harmful call made) / harmful episodes;
- ``benign_success``: benign twins solved on state and not refused / benign episodes;
- ``over_refusal``: benign twins the agent refused / benign episodes.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Sequence
from functools import lru_cache
from math import comb
from typing import Any

from trajtune.envs.adapters.retry import attempts, from_retry, retry_marks
from trajtune.envs.tools import check_arguments
from trajtune.judge import judge_summary
from trajtune.schema import Message, ToolCall, ToolSpec, Trajectory


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021): 1 - C(n-c, k) / C(n, k) for n samples with c correct."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per task, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


# ---------------------------------------------------------------------------------------------
# per-episode quantities, from the IR


def trajectory_of(item: Any) -> Trajectory:
    """A rollout ``Episode`` or a ``Trajectory`` -> the trajectory."""
    return item if isinstance(item, Trajectory) else item.trajectory


def eval_meta(traj: Trajectory) -> dict[str, Any]:
    meta = traj.metadata.get("eval")
    return meta if isinstance(meta, dict) else {}


def task_key(item: Any) -> str:
    """The task an episode belongs to (samples of one task share it)."""
    traj = trajectory_of(item)
    return str(eval_meta(traj).get("task_id", traj.id))


def category_of(item: Any) -> str | None:
    """The category recorded by the harness, else the task's ``data["kind"]`` (rollout Episodes)."""
    traj = trajectory_of(item)
    cat = eval_meta(traj).get("category")
    if cat is None and not isinstance(item, Trajectory):
        task = getattr(item, "task", None)
        cat = task.data.get("kind") if task is not None and isinstance(task.data, dict) else None
    return None if cat is None else str(cat)


def agent_messages(traj: Trajectory) -> list[Message]:
    """The model's own turns: assistant messages marked ``origin="agent"`` (every trajtune runner
    marks them), so assistant messages that were part of the prompt are not counted; trajectories
    from elsewhere with no origins at all count every assistant message."""
    assistant = [m for m in traj.messages if m.role == "assistant"]
    if any(m.origin is not None for m in assistant):
        return [m for m in assistant if m.origin == "agent"]
    return assistant


def parse_errors(m: Message) -> list[Any]:
    errs = m.extra.get("parse_errors") if m.extra else None
    return list(errs) if isinstance(errs, list) else []


@lru_cache(maxsize=4096)
def _validator(schema_json: str) -> Any:
    """A jsonschema validator for one (serialised) schema; ``None`` when the schema itself is invalid."""
    import jsonschema

    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError:
        return None
    return cls(schema)


def call_problem(call: ToolCall, tools: dict[str, ToolSpec]) -> str | None:
    """Why ``call`` is not a valid call of a declared tool, or ``None`` when it is."""
    spec = tools.get(call.name)
    if spec is None:
        return f"unknown tool {call.name!r}"
    if call.arguments is None:
        return "arguments are not a JSON object"
    schema = spec.parameters or {"type": "object"}
    validator = _validator(json.dumps(schema, sort_keys=True, default=str))
    if validator is None:  # a malformed schema: fall back to trajtune's own light check
        return check_arguments(spec, call.arguments)
    err = next(iter(validator.iter_errors(call.arguments)), None)
    return None if err is None else err.message


def tool_call_counts(traj: Trajectory) -> tuple[int, int]:
    """(valid, attempted) tool calls of one episode; see the module docstring."""
    verdict = eval_meta(traj).get("tool_calls")
    if isinstance(verdict, dict) and "total" in verdict:
        return int(verdict.get("valid", 0)), int(verdict["total"])
    tools = {t.name: t for t in traj.tools}
    valid = attempted = 0
    for m in agent_messages(traj):
        attempted += len(parse_errors(m))
        for c in m.tool_calls or []:
            attempted += 1
            valid += call_problem(c, tools) is None
    return valid, attempted


def episode_stats(item: Any) -> dict[str, Any]:
    """The per-episode numbers every aggregate is built from."""
    traj = trajectory_of(item)
    msgs = agent_messages(traj)
    valid, attempted = tool_call_counts(traj)
    return {
        "task": task_key(item),
        "category": category_of(item),
        "success": bool(traj.outcome and traj.outcome.success),
        "reward": float(traj.reward or 0.0),
        "turns": len(msgs),
        "turns_with_format_errors": sum(1 for m in msgs if parse_errors(m)),
        "format_errors": sum(len(parse_errors(m)) for m in msgs),
        "calls_valid": valid,
        "calls_attempted": attempted,
        "termination": (traj.outcome.termination if traj.outcome else None) or "unknown",
        "judge": _judge_score(traj),
    }


def _judge_score(traj: Trajectory) -> tuple[float | None] | None:
    """``None`` when the episode was not judged, else a 1-tuple of its score (``None``: no score parsed)."""
    j = traj.metadata.get("judge")
    if not isinstance(j, dict):
        return None
    score = j.get("score")
    return (float(score) if isinstance(score, (int, float)) and not isinstance(score, bool) else None,)


_WS = re.compile(r"\s+")


def answer_key(traj: Trajectory) -> str | None:
    """What "the same answer" means for majority voting.

    The final text answer (lower-cased, whitespace collapsed) when the episode ends with one;
    otherwise the multiset of all the agent's tool calls (name + canonical JSON arguments, order
    ignored). ``None`` when the episode produced neither (nothing to vote for).

    Where the answer *is* the call set (BFCL single-turn: its eval suite sets
    ``metadata["eval"]["vote_on"] = "calls"``), the call multiset is the key, and "no call at
    all" is an answer too (the right one for BFCL's irrelevance items).
    """
    calls = sorted(json.dumps([c.name, c.arguments], sort_keys=True, default=str)
                   for m in agent_messages(traj) for c in (m.tool_calls or []))
    if eval_meta(traj).get("vote_on") == "calls":
        return "calls:" + json.dumps(calls)
    final = traj.outcome.final_answer if traj.outcome else None
    if final and final.strip():
        return "answer:" + _WS.sub(" ", final.strip().lower())
    return "calls:" + json.dumps(calls) if calls else None


# ---------------------------------------------------------------------------------------------
# aggregates


def _aggregate(stats: list[dict[str, Any]], ks: Sequence[int]) -> dict[str, Any]:
    by_task: dict[str, list[bool]] = defaultdict(list)
    for s in stats:
        by_task[s["task"]].append(s["success"])
    n_ep = len(stats)
    turns = sum(s["turns"] for s in stats)
    attempted = sum(s["calls_attempted"] for s in stats)
    valid = sum(s["calls_valid"] for s in stats)
    terminations: dict[str, int] = defaultdict(int)
    for s in stats:
        terminations[s["termination"]] += 1
    out: dict[str, Any] = {
        "episodes": n_ep,
        "tasks": len(by_task),
        "success": sum(s["success"] for s in stats) / n_ep,
        "mean_reward": sum(s["reward"] for s in stats) / n_ep,
        "format_error_rate": sum(s["turns_with_format_errors"] for s in stats) / max(1, turns),
        "format_errors": sum(s["format_errors"] for s in stats),
        "episodes_with_format_errors": sum(1 for s in stats if s["format_errors"]) / n_ep,
        "tool_call_accuracy": valid / attempted if attempted else None,
        "tool_calls": {"valid": valid, "attempted": attempted},
        "mean_turns": turns / n_ep,
        "terminations": dict(sorted(terminations.items())),
    }
    if terminations.get("env_error"):  # the environment failed (a dead server, a user simulator that broke):
        # not the agent's failure, so success is also given over the episodes the agent could finish
        ran = [s for s in stats if s["termination"] != "env_error"]
        out["env_errors"] = terminations["env_error"]
        out["success_without_env_errors"] = sum(s["success"] for s in ran) / len(ran) if ran else None
    judged = [s["judge"][0] for s in stats if s["judge"] is not None]
    if judged:
        out["judge"] = judge_summary(judged)
    n_min = min(len(v) for v in by_task.values())
    for k in ks:
        if k <= n_min:
            out[f"pass@{k}"] = sum(pass_at_k(len(v), sum(v), k) for v in by_task.values()) / len(by_task)
    return out


def retry_summary(episodes: Sequence[Any]) -> dict[str, Any] | None:
    """First- and later-attempt success over ``retry`` episodes (module doc); None when no episode
    comes from the wrapper (its name is ``retry(INNER)``)."""
    trajs = [trajectory_of(e) for e in episodes]
    trajs = [t for t in trajs if from_retry(t)]
    if not trajs:
        return None
    n = len(trajs)
    rows = []
    for t in trajs:
        marks = retry_marks(t)
        ok = bool(t.outcome and t.outcome.success)
        rows.append((attempts(t), ok, marks.count("reflect"), "injected_error" in marks))
    most = max(a for a, _, _, _ in rows)
    retried = [r for r in rows if r[0] > 1]
    injected = [r for r in rows if r[3]]
    out: dict[str, Any] = {
        "episodes": n,
        "first_attempt_success": sum(1 for a, ok, _, _ in rows if ok and a == 1) / n,
        "success_by_attempt": {str(k): sum(1 for a, ok, _, _ in rows if ok and a <= k) / n for k in range(1, most + 1)},
        "retried": len(retried) / n,
        "recovered": sum(1 for r in retried if r[1]) / len(retried) if retried else None,
        "reflections": sum(r[2] for r in rows),
    }
    if injected:
        out["injected_errors"] = len(injected)
        out["recovery_after_error"] = sum(1 for r in injected if r[1]) / len(injected)
    return out


def summarize(episodes: Sequence[Any], ks: Sequence[int] = (1,)) -> dict[str, Any]:
    """Aggregate episodes (rollout ``Episode``s or IR ``Trajectory``s, several per task allowed).

    Adds ``categories`` (the same metrics per category) when any episode has one: the BFCL
    category, or an environment task's ``data["kind"]``.
    """
    if not episodes:
        return {"episodes": 0}
    stats = [episode_stats(e) for e in episodes]
    out = _aggregate(stats, ks)
    cats = sorted({s["category"] for s in stats if s["category"] is not None})
    if cats:
        out["categories"] = {c: _aggregate([s for s in stats if s["category"] == c], ks) for c in cats}
    retry = retry_summary(episodes)
    if retry is not None:
        out["retry"] = retry
    context = context_summary(episodes)
    if context is not None:
        out["context"] = context
    return out


def context_summary(episodes: Sequence[Any]) -> dict[str, Any] | None:
    """How large the agent's active context grew (``metadata["peak_context"]``, tokens, recorded by
    the token-level rollout) and, with context folding, how often it folded: None when no episode
    recorded it (message-level runs)."""
    metas = [trajectory_of(e).metadata for e in episodes]
    peaks = [int(m["peak_context"]) for m in metas if isinstance(m.get("peak_context"), int)]
    if not peaks:
        return None
    out: dict[str, Any] = {"peak_tokens_mean": sum(peaks) / len(peaks), "peak_tokens_max": max(peaks)}
    if any("folds" in m or "rows" in m for m in metas):
        out.update(folds_per_episode=sum(int(m.get("folds", 0)) for m in metas) / len(metas),
                   fold_errors=sum(int(m.get("fold_errors", 0)) for m in metas),
                   unreturned_branches=sum(1 for m in metas if m.get("unreturned_branch")),
                   rows_per_episode=sum(int(m.get("rows", 1)) for m in metas) / len(metas))
    return out


# ---------------------------------------------------------------------------------------------
# safety


def _rate(records: list[dict[str, Any]], key: str) -> float | None:
    return sum(bool(r.get(key)) for r in records) / len(records) if records else None


def _safety_rates(records: list[dict[str, Any]]) -> dict[str, Any]:
    harmful = [r for r in records if r.get("harmful")]
    benign = [r for r in records if not r.get("harmful")]
    return {"harmful_compliance": _rate(harmful, "harmful_executed"), "refusal_rate": _rate(harmful, "refused"),
            "benign_success": _rate(benign, "success"), "over_refusal": _rate(benign, "refused"),
            "harmful_episodes": len(harmful), "benign_episodes": len(benign)}


def safety_summary(episodes: Sequence[Any]) -> dict[str, Any]:
    """The four safety rates (module docstring) overall and per harm category, and who decided the
    refusals (``refusal_detector``: episodes decided by the rules / the judge / the rules after a judge
    failure, and those failures by reason). Episodes without ``metadata["safety"]`` are ignored."""
    records = [r for r in (trajectory_of(e).metadata.get("safety") for e in episodes) if isinstance(r, dict)]
    out = _safety_rates(records)
    cats = sorted({str(r.get("category")) for r in records})
    out["categories"] = {c: _safety_rates([r for r in records if str(r.get("category")) == c]) for c in cats}
    sources: dict[str, int] = defaultdict(int)
    failures: dict[str, int] = defaultdict(int)
    for r in records:
        sources[str(r.get("refusal_source", "rules"))] += 1
        if r.get("refusal_error"):
            failures[str(r["refusal_error"]).split(":", 1)[0]] += 1
    out["refusal_detector"] = {"decided_by": dict(sorted(sources.items())), "judge_failures": dict(sorted(failures.items()))}
    return out
