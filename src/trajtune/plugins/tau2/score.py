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
- **NL_ASSERTION** needs a language-model judge (the ``nl_judge`` option): it reads the conversation
  and the task's assertions with τ²-bench's prompt (``nl_judge_messages``) and answers each with
  ``metExpectation``; the component is 1 when every assertion is met. Without a judge, or when the
  judge fails or answers something unreadable, a task that has assertions leaves that component
  unscored (``None``) and the verdict says so (with the judge's error). A task without assertions
  scores 1.

The reward is the product of the components in the task's ``reward_basis`` (default DB and
COMMUNICATE); success is a reward of 1. An episode that did not end by the user or the agent
stopping scores 0 (τ²-bench's "terminated prematurely"); that is the caller's check.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from trajtune.schema import Message

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


#: τ²-bench's instruction to the judge of natural-language assertions (evaluator_nl_assertions.py).
NL_JUDGE_SYSTEM = """TASK
- You will be given a list of expected outcomes and a conversation that was collected during a test case run.
- The conversation is between an agent and a customer.
- Your job is to evaluate whether the agent satisfies each of the expected outcomes.
- Grade each expected outcome individually.

FORMAT
- Your response should be a JSON object with the following fields:
- `reasoning`: a short explanation for your classification
- `metExpectation`: `true` if the agent satisfies the expected outcomes, `false` otherwise
- `expectedOutcome`: repeat the expectation from the input that you are grading

Example response structure:
{
    "results": [
        {
            "expectedOutcome": "<one of the expected outcomes from the input>",
            "reasoning": "<reasoning trace>",
            "metExpectation": <false or true>
        }
    ]
}"""


def nl_judge_messages(transcript: list[str], assertions: list[str]) -> list[Message]:
    """The judge's request: the instruction, then the conversation and the expected outcomes, as
    τ²-bench writes them."""
    outcomes = "\n".join(f"- {a}" for a in assertions)
    conversation = "\n".join(transcript)
    return [Message(role="system", content=NL_JUDGE_SYSTEM),
            Message(role="user", content=f"conversation:\n{conversation}\n\nexpectedOutcomes:\n{outcomes}")]


def parse_nl_results(text: str, assertions: list[str]) -> list[dict[str, Any]]:
    """One ``{"assertion", "met", "reasoning"}`` per assertion from the judge's reply; ValueError when
    the reply has no ``results`` list with a boolean ``metExpectation`` for every assertion (matched
    by ``expectedOutcome``, else by position)."""
    dec = json.JSONDecoder()
    found = None
    i = text.find("{")
    while i >= 0 and found is None:
        try:
            obj, end = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict) and isinstance(obj.get("results"), list):
            found = obj["results"]
        i = text.find("{", end)
    if found is None:
        raise ValueError(f"no JSON object with a results list in the judge's reply: {text[:120]!r}")
    items = [r for r in found if isinstance(r, dict) and isinstance(r.get("metExpectation"), bool)]
    by_text = {str(r.get("expectedOutcome", "")).strip(): r for r in items}
    out = []
    for k, a in enumerate(assertions):
        r = by_text.get(a.strip()) or (items[k] if len(items) == len(assertions) else None)
        if r is None:
            raise ValueError(f"the judge's reply grades {len(items)} of {len(assertions)} expected outcomes "
                             f"(none for {a[:80]!r})")
        out.append({"assertion": a, "met": r["metExpectation"], "reasoning": str(r.get("reasoning", ""))[:500]})
    return out


def verdict(criteria: dict[str, Any] | None, *, db_match: bool, agent_texts: list[str],
            calls: list[dict[str, Any]], nl_results: list[dict[str, Any]] | None = None) -> dict[str, Any]:
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
        # scored only by a judge's answers (nl_results); without them, unscored rather than guessed
        "NL_ASSERTION": (1.0 if all(r["met"] for r in nl_results) else 0.0) if nl and nl_results is not None
        else (None if nl else 1.0),
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
            "checks": components, "unscored": unscored, "communicate": comm, "actions": acts,
            "nl_assertions": nl_results if nl_results is not None else [{"assertion": a, "met": None} for a in nl]}
