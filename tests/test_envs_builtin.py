"""Built-in environments: deterministic tasks, disjoint splits, working experts, success on state."""

from __future__ import annotations

import json

import pytest

from trajtune.envs import make_env
from trajtune.envs.builtin import BUILTIN_ENVS
from trajtune.envs.runner import run_episode
from trajtune.envs.toolenv import split_task_seed
from trajtune.schema import Message, ToolCall, Trajectory, parse_trajectory, trajectory_to_json


def call(name: str, /, **args) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=f"c{name}", name=name, arguments=args)])


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def test_split_seeds_are_disjoint_and_validated():
    train = {split_task_seed("train", i, s) for i in range(200) for s in range(5)}
    test = {split_task_seed("test", i, s) for i in range(200) for s in range(5)}
    assert not train & test
    with pytest.raises(ValueError):
        split_task_seed("dev", 0, 0)


@pytest.mark.parametrize("name", BUILTIN_ENVS)
def test_tasks_deterministic_and_splits_disjoint(name):
    env = make_env(name)
    a, b = env.tasks("train", 6, seed=3), env.tasks("train", 6, seed=3)
    assert [t.data for t in a] == [t.data for t in b] and [t.id for t in a] == [t.id for t in b]
    test = env.tasks("test", 6, seed=3)
    assert not {t.seed for t in a} & {t.seed for t in test}
    assert all(t.split == "test" for t in test)
    assert len({t.id for t in a}) == 6


@pytest.mark.parametrize("name", BUILTIN_ENVS)
def test_expert_trajectories_succeed_and_are_well_formed(name):
    env = make_env(name)
    tasks = env.tasks("train", 8, seed=1)
    trajs = [make_env(name).expert(t) for t in tasks]
    wins = sum(bool(t.outcome.success) for t in trajs)
    assert wins >= (6 if name == "bandit" else 8), [t.metadata for t in trajs if not t.outcome.success]
    for traj in trajs:
        assert traj.outcome.termination == "done"
        assert traj.messages[-1].role == "assistant" and not traj.messages[-1].tool_calls
        calls = [c.id for m in traj.messages for c in (m.tool_calls or [])]
        answered = [m.tool_call_id for m in traj.messages if m.role == "tool"]
        assert sorted(calls) == sorted(answered) and len(set(calls)) == len(calls)
        assert all(m.reward is not None for m in traj.messages if m.role == "assistant")
        assert traj.reward == pytest.approx(sum(m.reward for m in traj.messages if m.role == "assistant"))
        again = parse_trajectory(json.loads(trajectory_to_json(traj)))
        assert isinstance(again, Trajectory) and again.messages == traj.messages
        names = {t.name for t in traj.tools}
        assert all(c.name in names for m in traj.messages for c in (m.tool_calls or []))


def _start(name, kind=None, **match):
    env = make_env(name)
    for t in env.tasks("train", 200, seed=0):
        if kind is None or t.data.get("kind", t.data.get("goal", {}).get("kind")) == kind:
            if all(t.data.get(k) == v for k, v in match.items()):
                env.reset(t)
                return env, t
    raise AssertionError("no such task")


def test_workspace_near_duplicate_tool_fails_on_state():
    env, task = _start("workspace", "credit")
    g = task.data["goal"]
    other = next(a for a in task.data["accounts"] if a != g["account_id"])
    env.step(call("transfer_credit", from_account_id=other, to_account_id=g["account_id"], amount=g["amount"]))
    r = env.step(say("Done."))
    # the target's balance went up by the right amount, but credit was moved, not granted
    if task.data["accounts"][other]["balance"] >= g["amount"]:
        assert env.accounts[g["account_id"]]["balance"] == task.data["accounts"][g["account_id"]]["balance"] + g["amount"]
    assert r.done and r.reward == 0.0 and not env.success()
    env.reset(task)
    env.step(call("add_credit", account_id=g["account_id"], amount=g["amount"]))
    assert env.step(say("Done.")).reward == 1.0 and env.success()


def test_workspace_reminder_is_not_a_meeting():
    env, task = _start("workspace", "schedule")
    g = task.data["goal"]
    env.step(call("create_reminder", title=g["title"], date=g["date"]))
    env.step(say("Done."))
    assert not env.success()


def test_workspace_clarification_required():
    env, task = _start("workspace", "schedule_clarify")
    g = task.data["goal"]
    email = task.data["accounts"][g["account_id"]]["email"]
    # guessing the time fails even when the guess happens to be right
    env.step(call("create_event", title=g["title"], date=g["date"], time=g["time"], attendees=[email]))
    r = env.step(say("Which time did you want?"))
    assert not r.done and g["time"] in r.observations[0].text() and r.observations[0].role == "user"
    env.step(say("Done."))
    assert not env.success()
    # asking first, then acting on the answer succeeds
    env.reset(task)
    r = env.step(say("What time should it start?"))
    assert not r.done
    env.step(call("create_event", title=g["title"], date=g["date"], time=g["time"], attendees=[email]))
    assert env.step(say("Booked.")).reward == 1.0


def test_workspace_tool_errors_are_observations():
    env, task = _start("workspace", "cancel_order")
    r = env.step(call("cancel_order", order_id="O0000"))
    assert not r.done and r.observations[0].text() == "Error: no order with id 'O0000'"
    r = env.step(call("find_account", name=42))
    assert "must be string" in r.observations[0].text()


def test_code_math_runs_code_in_sandbox_and_checks_answer():
    env, task = _start("code_math", "shop")
    r = env.step(call("run_python", code=task.data["reference_code"]))
    assert r.observations[0].text().strip() == str(task.data["answer"])
    r = env.step(call("run_python", code="import os\nos.system('echo hi')"))
    assert "blocked operation: process" in r.observations[0].text()
    env.step(call("submit_answer", answer=task.data["answer"] + 1))
    assert env.step(say("done")).reward == 0.0 and not env.success()
    env.reset(task)
    env.step(call("submit_answer", answer=float(task.data["answer"])))
    assert env.step(say("done")).reward == 1.0


def test_code_math_expected_answers_by_hand():
    from trajtune.envs.code_math import _primes_below
    assert [_primes_below(n) for n in (2, 3, 10, 100)] == [0, 1, 4, 25]


def test_search_qa_retrieval_and_fallback_agree_on_entities():
    from trajtune.envs.search_qa import _MiniBM25, corpus, index, normalize_answer
    docs = corpus()["docs"]
    mini = _MiniBM25([d["title"] + ". " + d["text"] for d in docs])
    for c in corpus()["companies"][:5]:
        top_bm25s = docs[index().top(c["name"], 5)[0][0]]["title"]
        top_mini = docs[mini.top(c["name"], 5)[0][0]]["title"]
        assert top_bm25s == c["name"] == top_mini
    assert normalize_answer(" The  Kestria! ") == "kestria"


def test_search_qa_success_needs_the_right_answer():
    env, task = _start("search_qa", "hq_country")
    env.step(call("submit_answer", answer="Atlantis"))
    assert env.step(say("x")).reward == 0.0
    env.reset(task)
    r = env.step(call("search", query="zzzz qqqq"))
    assert r.observations[0].text().startswith("Error: no results")
    env.step(call("submit_answer", answer=task.data["answer"].upper()))
    assert env.step(say("x")).reward == 1.0


def test_bandit_rewards_budget_and_success_rule():
    env, task = _start("bandit")
    k, best, budget = len(task.data["probs"]), task.data["best"], task.data["budget"]
    assert env.step(call("pull", arm=k)).observations[0].text().startswith("Error: arm must be")
    total = 0.0
    for _ in range(budget):
        r = env.step(call("pull", arm=best))
        paid = int(r.observations[0].text().split("paid ")[1][0])
        assert r.reward == paid
        total += r.reward
    assert "no pulls left" in env.step(call("pull", arm=best)).observations[0].text()
    assert env.success()
    env.reset(task)
    for _ in range(budget):
        env.step(call("pull", arm=(best + 1) % k))
    assert not env.success()


def test_tictactoe_rules_and_opponent():
    from trajtune.envs.tictactoe import winner
    assert winner(list("XXXOO    ")) == "X" and winner(list("XOXXOOOXX")) == "draw" and winner([" "] * 9) is None
    env, task = _start("tictactoe", agent_first=True)
    assert env.board == [" "] * 9
    env.step(call("move", cell=1))
    o1 = env.board.index("O")
    assert "not free" in env.step(call("move", cell=o1 + 1)).observations[0].text()
    # threaten a line: the fixed opponent must block it (unless it can win first, impossible here)
    free = [i for i in range(9) if env.board[i] == " "]
    second = next(c for c in (1, 3, 4) if c in free and (2 * c) < 9 and (2 * c) in free)
    env.step(call("move", cell=second + 1))
    assert env.board[2 * second] == "O"


def test_sokoban_solver_and_moves():
    from trajtune.envs.sokoban import solve
    walls = frozenset({(0, c) for c in range(5)} | {(2, c) for c in range(5)} | {(1, 0), (1, 4)})
    # corridor: player at (1,1), box at (1,2), target at (1,3): one push right
    assert solve(walls, frozenset({(1, 3)}), (1, 1), frozenset({(1, 2)})) == ["right"]
    assert solve(walls, frozenset({(1, 1)}), (1, 3), frozenset({(1, 2)})) == ["left"]
    env, task = _start("sokoban")
    plan = solve(env.walls, env.targets, env.player, env.boxes)
    assert len(plan) == task.data["optimal"]
    rewards = [env.step(call("move", direction=d)).reward for d in plan]
    assert env.success()
    assert "already solved" in env.step(call("move", direction="up")).observations[0].text()
    assert sum(rewards) == pytest.approx(0.1 * (len(env.targets) - len(set(map(tuple, task.data["boxes"])) & env.targets)))
    assert env.step(say("done")).reward == pytest.approx(1.0)


def test_memory_requires_every_crud_op():
    env, task = _start("memory")
    events = task.data["events"]
    expert = make_env("memory").expert(task)
    ops = [c.name for m in expert.messages for c in (m.tool_calls or [])]
    assert ops.count("memory_create") == sum(e["op"] == "create" for e in events)
    assert "memory_update" in ops and "memory_delete" in ops and "memory_read" in ops
    # an agent that answers correctly but skipped the delete fails on state
    for ev in events:
        if ev["op"] == "create":
            env.step(call("memory_create", key=ev["key"], value=ev["value"]))
        elif ev["op"] == "update":
            env.step(call("memory_update", key=ev["key"], value=ev["value"]))
        elif ev["op"] == "ask":
            env.step(call("answer", text=task.data["answer"]))
            break
        env.step(say("Noted."))
    r = env.step(say("Here you go."))
    assert r.done and r.reward == 0.0 and not env.success()


def test_run_episode_against_builtin_records_max_turns():
    env = make_env("sokoban")
    task = env.tasks("test", 1)[0]
    t = run_episode(env, task, lambda m, tools: call("move", direction="up"), max_turns=3)
    assert t.outcome.termination == "max_turns" and t.outcome.success is False and t.metadata["turns"] == 3
