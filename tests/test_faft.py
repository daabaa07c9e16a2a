"""FAFT: (request + the verifier's feedback on this plan) → plan; at inference the slot says all pass."""

from __future__ import annotations

import json

import pytest

from trajtune.algorithms.faft import FEEDBACK_PREFIX, faft_records
from trajtune.envs import make_env
from trajtune.errors import DataError
from trajtune.schema import Message, ToolCall


def test_trip_reports_the_verdict_as_feedback_and_episodes_record_it():
    env = make_env("trip", difficulty=0)
    t = env.tasks("train", 1, seed=0)[0]
    traj = env.expert(t)  # through the runner
    assert traj.metadata["feedback"] == "all constraints pass"
    env.reset(t)
    env.step(Message(role="assistant", tool_calls=[ToolCall(id="a", name="submit_plan", arguments={
        "flight": "F000", "hotel": "x", "restaurants": []})]))
    assert env.step(Message(role="assistant", content="done")).info["feedback"].startswith("the plan fails: schema")
    env.reset(t)
    assert env.step(Message(role="assistant", content="no")).info["feedback"] == "no plan was submitted"


def test_records_get_their_own_feedback_and_records_without_are_counted():
    env = make_env("trip", difficulty=1)
    good = [env.expert(t) for t in env.tasks("train", 3, seed=0)]
    failed = good[0].model_copy(deep=True)
    failed.metadata["feedback"] = "the plan fails: budget"
    bare = good[1].model_copy(deep=True)
    del bare.metadata["feedback"]
    out, counts = faft_records([good[0], failed, bare])
    assert counts == {"no_feedback": 1, "with_feedback": 2}
    asks = [next(m for m in t.messages if m.role == "user").text() for t in out]
    assert asks[0].endswith(FEEDBACK_PREFIX + "all constraints pass")
    assert asks[1].endswith(FEEDBACK_PREFIX + "the plan fails: budget")
    assert asks[0].startswith(good[0].messages[1].text())  # the request itself is unchanged
    assert out[0].messages[2:] == good[0].messages[2:]      # and so is everything after it
    with pytest.raises(DataError, match="none of the 1 records has metadata.feedback"):
        faft_records([bare])


def test_the_slot_at_inference_and_an_sft_run_with_faft(tmp_path, tiny_dir):
    from trajtune.algorithms.sft import SFTRunConfig
    from trajtune.config import load_config
    from trajtune.errors import ConfigError
    from trajtune.schema import write_trajectories
    from trajtune.train import run

    slot = make_env("feedback_slot", env="trip", text="all constraints pass", kwargs={"difficulty": 2})
    t = slot.tasks("test", 1, seed=0)[0]
    first = slot.reset(t).messages[1].text()
    assert first == make_env("trip", difficulty=2).reset(t).messages[1].text() + "\n\n" + FEEDBACK_PREFIX + \
        "all constraints pass"
    env = make_env("trip")
    recs = [env.expert(t) for t in env.tasks("train", 4, seed=0)]
    recs[1].metadata["feedback"] = "the plan fails: budget"
    data = tmp_path / "d.jsonl"
    write_trajectories(data, recs)
    out = tmp_path / "run"
    res = run(load_config(None, SFTRunConfig, [f"model={tiny_dir}", f"output_dir={out}", f"data.path={data}",
                                                "data.faft=true", "data.max_length=4096", "train.steps=1",
                                                "train.batch_size=2", "report=false"]), quiet=True)
    assert res["faft"] == {"with_feedback": 4}
    with pytest.raises(ConfigError, match="sft option"):
        from trajtune.algorithms.rft import RFTRunConfig

        load_config(None, RFTRunConfig, [f"model={tiny_dir}", "output_dir=o", "env=trip", f"data.path={data}",
                                         "data.faft=true"])


def test_eval_through_the_slot_from_the_cli(tmp_path, tiny_dir):
    from typer.testing import CliRunner

    from trajtune.cli.main import app

    r = CliRunner().invoke(app, ["eval", "--model", str(tiny_dir), "--env",
                                 "{name: feedback_slot, kwargs: {env: trip, kwargs: {difficulty: 0}}}", "--tasks", "2",
                                 "--max-turns", "1", "--max-new-tokens", "4", "--out", str(tmp_path / "ev"),
                                 "--no-report"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    eps = [json.loads(x) for x in (tmp_path / "ev" / "episodes.jsonl").read_text().splitlines()]
    assert len(eps) == 2
    assert all(e["messages"][1]["content"].endswith(FEEDBACK_PREFIX + "all constraints pass") for e in eps)


def test_rollouts_record_the_feedback(tiny_tok, tiny_model):
    """The batched rollout loop (RL, eval) keeps the verifier's feedback as the runner does."""
    from trajtune.chat.render import ChatRenderer
    from trajtune.rollout import RolloutConfig, run_rollouts

    renderer = ChatRenderer(tiny_tok)
    answer = tiny_tok.encode("I cannot plan that.", add_special_tokens=False) + [renderer.stop_ids()[0]]

    class Says:  # a sampler that gives a final answer (no tool call) at once
        def turn(self, rows, room, seed):
            return [(list(answer), [0.0] * len(answer), True, None) for _ in rows]

    tasks = make_env("trip").tasks("test", 2, seed=0)
    eps = run_rollouts(tiny_model, tiny_tok, lambda: make_env("trip"), tasks, RolloutConfig(max_turns=2), renderer=renderer,
                       sampler=Says())
    assert [e.trajectory.metadata["feedback"] for e in eps] == ["no plan was submitted"] * 2
    assert all(e.trajectory.metadata["reward_info"] == {"schema_valid": 0.0, "constraints": 0.0, "pass": 0.0}
               for e in eps)


def test_the_feedback_slot_keeps_the_wrapped_environments_snapshots():
    from trajtune.envs import make_env
    from trajtune.schema import Message, ToolCall

    env = make_env("feedback_slot", env="trip")
    assert env.can_snapshot()
    task = env.tasks("test", 1, seed=0)[0]
    env.reset(task)
    state = env.snapshot()
    search = Message(role="assistant", tool_calls=[ToolCall(id="c1", name="search_flights", arguments={
        "origin": task.data["origin"], "destination": task.data["destination"]})])
    first = env.step(search).observations[0].content
    env.restore(state)  # back before the search: the same call answers the same again
    assert env.step(search).observations[0].content == first
