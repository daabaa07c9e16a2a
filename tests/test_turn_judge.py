"""rl.turn_judge: an LLM grades each turn −1/0/+1; c · score joins the turn rewards (ALGORITHMS.md,
turn-level credit (a) and (b)); garbage, errors and timeouts are counted as "no score", never a crash."""

from __future__ import annotations

import json

import pytest

from trajtune.algorithms.advantages import turn_returns
from trajtune.algorithms.turn_judge import TurnJudge, TurnJudgeSpec, parse_scores
from trajtune.rollout import Episode
from trajtune.schema import Message, ToolCall, Trajectory
from trajtune.tokens import SOURCE_ENV, SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory


def _episode(turn_rewards: list[float]) -> Episode:
    msgs = [Message(role="user", content="do it")]
    ids, src, turn = [1], [SOURCE_PROMPT], [0]
    for k, r in enumerate(turn_rewards):
        msgs += [Message(role="assistant", reward=r, tool_calls=[ToolCall(id=f"c{k}", name="f", arguments={"k": k})]),
                 Message(role="tool", tool_call_id=f"c{k}", name="f", content="ok")]
        ids += [2, 2, 3]
        src += [SOURCE_POLICY, SOURCE_POLICY, SOURCE_ENV]
        turn += [k, k, k + 1]
    tt = TokenTrajectory(ids=ids, source=src, turn=turn, weight=[float(s == SOURCE_POLICY) for s in src],
                         reward=sum(turn_rewards), meta={"turn_rewards": list(turn_rewards)})
    return Episode(trajectory=Trajectory(id="e", messages=msgs, reward=sum(turn_rewards)), tokens=tt, turns=len(turn_rewards))


def test_scores_are_parsed_strictly():
    assert parse_scores('ok: {"scores": [1, 0, -1]}', 3) == [1, 0, -1]
    for bad in ('{"scores": [1, 0]}', '{"scores": [2, 0, 0]}', '{"scores": [1, 0, true]}', '{"scores": "1,0,-1"}',
                "1, 0, -1", '{"scores": [1.0, 0, -1]}'):
        with pytest.raises(ValueError):
            parse_scores(bad, 3)


def test_scores_join_the_turn_rewards_and_the_episode_reward():
    replies = iter(['{"scores": [1, -1, 1]}', "no idea"])
    seen = []

    def complete(body):
        seen.append(body)
        return {"choices": [{"message": {"role": "assistant", "content": next(replies)}}]}

    judge = TurnJudge(TurnJudgeSpec(judge="openai:http://x/v1", coef=0.5, workers=1), complete, "m")
    a, b = _episode([0.0, 0.0, 1.0]), _episode([0.0, 1.0])
    m = judge(0, [a, b])
    # (a) episode credit: R = outcome + c · Σ s = 1 + 0.5 · 1
    assert a.tokens.reward == pytest.approx(1.5)
    # (b) turn credit: turn rewards (0.5, −0.5, 1.5); with γ = 1 the returns are (1.5, 1.0, 1.5)
    assert a.tokens.meta["turn_rewards"] == pytest.approx([0.5, -0.5, 1.5])
    assert turn_returns(a.tokens, 1.0) == pytest.approx([1.5, 1.0, 1.5])
    assert b.tokens.reward == 1.0 and b.trajectory.metadata["turn_scores"] is None  # garbage: no score
    assert m == {"turn_judge_mean": pytest.approx(1 / 3), "turn_judge_failures": 1.0}
    assert "[turn 3]" in seen[0]["messages"][1]["content"] and "3 agent turns" in seen[0]["messages"][1]["content"]

    def down(body):
        raise TimeoutError("timed out")

    c = _episode([1.0])
    assert TurnJudge(TurnJudgeSpec(judge="x"), down, "m")(0, [c]) == {"turn_judge_mean": 0.0,
                                                                       "turn_judge_failures": 1.0}
    assert c.tokens.reward == 1.0


def test_an_rl_run_through_an_http_judge_and_an_unreachable_one(tmp_path, tiny_dir):
    from test_judge import FakeJudgeServer

    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config
    from trajtune.errors import ModelLoadError
    from trajtune.train import run

    srv = FakeJudgeServer(['{"scores": [1]}', "garbage"])
    out = tmp_path / "rl"
    try:
        run(load_config(None, RLRunConfig, [
            f"model={tiny_dir}", f"output_dir={out}", "env=home", "rollout.max_turns=1", "rollout.max_new_tokens=8",
            "rl.tasks_per_step=1", "rl.group_size=2", "train.steps=1", "report=false",
            f"rl.turn_judge={{judge: 'openai:{srv.url}', coef: 0.25, workers: 1}}"]), quiet=True)
    finally:
        srv.close()
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert row["turn_judge_failures"] == 1.0 and row["turn_judge_mean"] == 1.0
    eps = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(str(e["metadata"]["turn_scores"]) for e in eps) == ["None", "[1]"]
    with pytest.raises(ModelLoadError, match="127.0.0.1:9"):
        run(load_config(None, RLRunConfig, [f"model={tiny_dir}", f"output_dir={tmp_path / 'x'}", "env=home",
                                            "rl.turn_judge={judge: 'openai:http://127.0.0.1:9/v1'}"]), quiet=True)
    assert not (tmp_path / "x").exists()
