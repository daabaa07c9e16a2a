"""`trip`: TravelPlanner-style planning under hard constraints; the verifier's named reward terms
(schema_valid, constraints, pass), the difficulty knob, the scripted expert."""

from __future__ import annotations

import json

import pytest

from trajtune.envs import make_env
from trajtune.envs.trip import cheapest_plan, plan_cost, verify
from trajtune.schema import Message, ToolCall


@pytest.mark.parametrize("level", [0, 1, 2])
def test_the_expert_solves_every_task_of_each_level(level):
    env = make_env("trip", difficulty=level)
    tasks = env.tasks("train", 12, seed=3)
    assert {t.data["difficulty"] for t in tasks} == {level}
    for t in tasks:
        traj = env.expert(t)
        assert traj.outcome.success, t.id
        calls = [c.name for m in traj.messages if m.role == "assistant" for c in m.tool_calls or []]
        assert calls == ["search_flights", "search_hotels", "search_restaurants", "submit_plan"]
        assert traj.messages[-1].role == "assistant" and traj.reward == 1.0


def test_tasks_are_deterministic_and_the_splits_disjoint():
    env = make_env("trip")
    a, b = env.tasks("train", 20, seed=1), env.tasks("train", 20, seed=1)
    assert [t.data for t in a] == [t.data for t in b]
    assert not {t.id for t in a} & {t.id for t in env.tasks("test", 20, seed=1)}
    assert {t.data["difficulty"] for t in a} == {0, 1, 2}
    with pytest.raises(ValueError, match="difficulty must be 0, 1 or 2"):
        make_env("trip", difficulty=5)


def _level2():
    return next(t for t in make_env("trip", difficulty=2).tasks("test", 30, seed=0) if t.data["people"] > 1)


def test_the_verifier_scores_schema_and_each_constraint():
    t = _level2()
    d = t.data
    best = cheapest_plan(d)
    assert verify(d, *best) == {"schema_valid": 1.0, "constraints": 1.0, "pass": 1.0, "failed": []}
    assert plan_cost(d, *best) <= d["budget"]
    # the most expensive flight, hotel and restaurant of the right kind: only the budget can fail
    want = d["want"]
    f = max((x for x in d["flights"] if x["to"] == d["destination"]), key=lambda x: x["price"])["flight"]
    r = [x["name"] for x in d["restaurants"] if x["cuisine"] == want["cuisine"]]
    fancy = max(r, key=lambda n: next(x["price"] for x in d["restaurants"] if x["name"] == n))
    v = verify(d, f, best[1], [fancy] * d["days"])
    if plan_cost(d, f, best[1], [fancy] * d["days"]) > d["budget"]:
        assert v == {"schema_valid": 1.0, "constraints": 0.75, "pass": 0.0, "failed": ["budget"]}
    wrong_food = next(x["name"] for x in d["restaurants"] if x["cuisine"] != want["cuisine"])
    assert "cuisine" in verify(d, *best[:2], [wrong_food] * d["days"])["failed"]
    small = [h for h in d["hotels"] if h["max_guests"] < d["people"]]
    if small:
        assert "guests" in verify(d, best[0], small[0]["name"], best[2])["failed"]
    for bad in ((best[0], "Nowhere Inn", best[2]), ("F000", *best[1:]), (best[0], best[1], best[2][:-1]),
                (best[0], best[1], "not a list")):
        assert verify(d, *bad)["schema_valid"] == 0.0 and verify(d, *bad)["pass"] == 0.0


def test_the_final_step_reports_the_reward_terms():
    env = make_env("trip", difficulty=1)
    t = env.tasks("test", 1, seed=0)[0]
    env.reset(t)
    f, h, r = cheapest_plan(t.data)
    call = Message(role="assistant", tool_calls=[ToolCall(id="a", name="submit_plan",
                                                          arguments={"flight": f, "hotel": h, "restaurants": r[:1]})])
    done = Message(role="assistant", content="Here is your plan.")
    first = env.step(call)
    assert not first.done and "does not meet: schema: restaurants" in first.observations[0].text()
    again = env.step(call)
    assert "already submitted" in again.observations[0].text()
    res = env.step(done)
    assert res.done and res.reward == 0.0 and not env.success()
    # one restaurant for a trip of 2+ days: not a well-formed plan
    assert res.info["reward_terms"] == {"schema_valid": 0.0, "constraints": 0.0, "pass": 0.0}
    env.reset(t)
    env.step(Message(role="assistant", tool_calls=[ToolCall(
        id="b", name="submit_plan", arguments={"flight": f, "hotel": h, "restaurants": r})]))
    ok = env.step(done)
    assert ok.done and ok.reward == 1.0 and env.success()
    assert ok.info["reward_terms"] == {"schema_valid": 1.0, "constraints": 1.0, "pass": 1.0}
    env.reset(t)
    bare = env.step(Message(role="assistant", content="I cannot plan that."))  # ends without a plan
    assert bare.done and bare.info["reward_terms"] == {"schema_valid": 0.0, "constraints": 0.0, "pass": 0.0}
    env.reset(t)
    searched = env.step(Message(role="assistant", tool_calls=[ToolCall(
        id="c", name="search_hotels", arguments={"city": t.data["destination"]})]))
    assert not searched.done and "reward_terms" not in searched.info
    assert {h["name"] for h in json.loads(searched.observations[0].text())} == {x["name"] for x in t.data["hotels"]}


def test_rl_with_shaped_terms_and_a_curriculum_on_trip(tmp_path, tiny_dir):
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config
    from trajtune.train import run

    out = tmp_path / "rl"
    run(load_config(None, RLRunConfig, [
        f"model={tiny_dir}", f"output_dir={out}", "env=trip", "rollout.max_turns=2", "rollout.max_new_tokens=8",
        "rl.tasks_per_step=1", "rl.group_size=2", "train.steps=1", "report=false", "rl.n_train_tasks=12",
        "rl.reward={terms: {info.schema_valid: 0.2, info.constraints: 0.5, info.pass: 1.0}}",
        "rl.curriculum={promote_at: 0.8, min_episodes: 4}"]), quiet=True)
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert row["curriculum_level"] == 0.0 and row["reward/info.pass"] == 0.0
    eps = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert all(e["id"].startswith("trip-train") for e in eps)
    assert all(set(e["metadata"]["reward_terms"]) == {"info.schema_valid", "info.constraints", "info.pass"} for e in eps)
