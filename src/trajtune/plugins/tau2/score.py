"""τ²-bench's verdict on an episode, with the rules of its evaluator (tau2/evaluator/*.py).

Why its own module: the rules are the benchmark's, not trajtune's, and they are pure functions of
the task's ``evaluation_criteria``, the databases and the agent's messages, so they are tested on
hand-built values without a server.

- **DB**: the database after the episode equals the one the gold actions produce from the same
  start. Both are compared as their *delta* from the start (the records that changed), which is
  equal exactly when the databases are, and small enough to cache per task.
- **COMMUNICATE**: each ``communicate_info`` string occurs in some text the agent wrote
  (lower-cased, the agent's commas removed: τ²-bench's rule).
- **ACTION**: each gold action matches some tool call of the agent: same name, and equal values on
  ``compare_args`` (all of the call's arguments when ``compare_args`` is null; none when empty).
- **NL_ASSERTION** needs a language-model judge; without one, a task that has assertions leaves
  that component unscored (``None``) and the verdict says so. A task without assertions scores 1.

The reward is the product of the components in the task's ``reward_basis`` (default DB and
COMMUNICATE); success is a reward of 1. An episode that did not end by the user or the agent
stopping scores 0 (τ²-bench's "terminated prematurely"); that is the caller's check.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

DEFAULT_BASIS = ("DB", "COMMUNICATE")
_DELETED = "__deleted__"


def db_delta(base: dict[str, Any], db: dict[str, Any]) -> dict[str, Any]:
    """The records of ``db`` that differ from ``base``, two levels deep (table -> record id)."""
    delta: dict[str, Any] = {}
    for table in sorted(set(base) | set(db)):
        a, b = base.get(table, _DELETED), db.get(table, _DELETED)
        if isinstance(a, dict) and isinstance(b, dict):
            changed = {k: b.get(k, _DELETED) for k in set(a) | set(b) if a.get(k, _DELETED) != b.get(k, _DELETED)}
            if changed:
                delta[table] = changed
        elif a != b:
            delta[table] = b
    return delta


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def changed_records(delta: dict[str, Any]) -> list[str]:
    """``table/id`` of every record a delta changes (for the verdict's breakdown)."""
    return sorted(f"{t}/{k}" for t, recs in delta.items() for k in (recs if isinstance(recs, dict) else [""]))


def communicate_checks(infos: list[str], agent_texts: list[str]) -> list[dict[str, Any]]:
    return [{"info": s, "met": any(s.lower() in t.lower().replace(",", "") for t in agent_texts)} for s in infos]


def action_matches(gold: dict[str, Any], call: dict[str, Any]) -> bool:
    if gold.get("name") != call.get("name"):
        return False
    args = call.get("arguments") or {}
    keys = args.keys() if gold.get("compare_args") is None else gold["compare_args"]
    if not keys:
        return True
    gold_args = gold.get("arguments") or {}
    return {k: v for k, v in args.items() if k in keys} == {k: v for k, v in gold_args.items() if k in keys}


def action_checks(gold_actions: list[dict[str, Any]], calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"action": a.get("action_id") or a.get("name"), "met": any(action_matches(a, c) for c in calls)}
            for a in gold_actions]


def verdict(criteria: dict[str, Any] | None, *, db_match: bool, agent_texts: list[str],
            calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The reward, its components and their evidence (``info["tau2"]``)."""
    if not criteria:
        return {"reward": 1.0, "basis": [], "components": {}, "checks": {}, "unscored": [], "communicate": [],
                "actions": [], "note": "no evaluation criteria"}
    basis = list(criteria.get("reward_basis") or DEFAULT_BASIS)
    comm = communicate_checks(list(criteria.get("communicate_info") or []), agent_texts)
    acts = action_checks(list(criteria.get("actions") or []), calls)
    nl = list(criteria.get("nl_assertions") or [])
    components: dict[str, float | None] = {
        "DB": 1.0 if db_match else 0.0,
        "COMMUNICATE": 1.0 if all(c["met"] for c in comm) else 0.0,
        "ACTION": 1.0 if all(a["met"] for a in acts) else 0.0,
        "NL_ASSERTION": None if nl else 1.0,  # a judge would score them; none is run
        "ENV_ASSERTION": None if criteria.get("env_assertions") else 1.0,
    }
    reward = 1.0
    unscored = []
    for b in basis:
        value = components.get(b)
        if value is None:
            unscored.append(b)
        else:
            reward *= value
    return {"reward": reward, "basis": basis, "components": {b: components.get(b) for b in basis},
            "checks": components, "unscored": unscored, "communicate": comm, "actions": acts}
