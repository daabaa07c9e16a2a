"""rl.reward: R = Σ λ_c(step) · r_c over named terms (built-in, environment-reported, plug-ins), with a
per-stage schedule; each term logged separately (ALGORITHMS.md, Reward shaping)."""

from __future__ import annotations

import json

import pytest

from trajtune.algorithms.rewards import RewardComposer, RewardSpec
from trajtune.errors import ConfigError
from trajtune.rollout import Episode
from trajtune.schema import Message, Outcome, Trajectory
from trajtune.tokens import SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory


def _episode(reward: float, success: bool, n_policy: int, turns: int, format_errors: int = 0,
             info: dict | None = None, last: str = "Done.", termination: str = "done") -> Episode:
    traj = Trajectory(id="t", reward=reward, outcome=Outcome(success=success, termination=termination),
                      metadata={"env": "fake", **({"reward_info": info} if info else {})},
                      messages=[Message(role="user", content="go"), Message(role="assistant", content=last)])
    src = [SOURCE_PROMPT] * 3 + [SOURCE_POLICY] * n_policy
    tt = TokenTrajectory(ids=[1] * len(src), source=src, turn=[0] * len(src), weight=[0.0] * len(src), reward=reward)
    return Episode(trajectory=traj, tokens=tt, format_errors=format_errors, turns=turns)


def test_weights_by_stage():
    spec = RewardSpec(terms={"success": 1.0, "info.progress": 0.5},
                      stages=[{"from_step": 10, "terms": {"success": 1.0}}, {"from_step": 20, "terms": {"env": 2.0}}])
    assert [spec.stage_at(s) for s in (0, 9, 10, 19, 20, 99)] == [0, 0, 1, 1, 2, 2]
    assert spec.weights_at(5) == {"success": 1.0, "info.progress": 0.5}
    assert spec.weights_at(10) == {"success": 1.0}
    assert spec.weights_at(25) == {"env": 2.0}
    assert spec.names() == ["success", "info.progress", "env"]


def test_composed_reward_and_per_term_metrics_with_known_numbers():
    spec = RewardSpec(terms={"env": 1.0, "success": 2.0, "format": 0.5, "length": -0.01, "turns": -0.1,
                             "info.calls": 0.25, "envfixtures:mentions_done": 3.0})
    a = _episode(0.5, True, 10, 2, info={"calls": 2.0})
    b = _episode(0.0, False, 30, 4, format_errors=1, info={"calls": 4.0}, last="I give up")
    m = RewardComposer(spec)(0, [a, b])
    # a: 0.5 + 2 + 0.5 − 0.1 − 0.2 + 0.5 + 3 = 6.2;  b: 0 + 0 + 0 − 0.3 − 0.4 + 1 + 0 = 0.3
    assert a.tokens.reward == pytest.approx(6.2) and b.tokens.reward == pytest.approx(0.3)
    assert a.trajectory.reward == 0.5  # the environment's return is kept as it was
    assert a.trajectory.metadata["reward_terms"]["length"] == 10.0
    assert m == pytest.approx({"reward/env": 0.25, "reward/success": 0.5, "reward/format": 0.5, "reward/length": 20.0,
                               "reward/turns": 3.0, "reward/info.calls": 3.0, "reward/envfixtures:mentions_done": 0.5,
                               "reward/errors": 0.0, "reward_stage": 0.0})


def test_a_plugin_that_raises_is_counted_as_a_reward_error_not_a_crash(capsys):
    spec = RewardSpec(terms={"env": 1.0, "envfixtures:fails_on_give_up": 1.0})
    composer = RewardComposer(spec)
    good = _episode(1.0, True, 3, 1)
    bad = _episode(0.0, False, 3, 1, last="I give up")
    m = composer(0, [good, bad, _episode(0.0, False, 3, 1, last="I give up")])
    assert good.tokens.reward == pytest.approx(1.0 + 0.5)
    assert bad.tokens.reward != bad.tokens.reward  # NaN: masked downstream, as an environment error is
    assert m["reward/errors"] == 2.0
    assert m["reward/envfixtures:fails_on_give_up"] == pytest.approx(0.5)  # the mean over the episodes that scored
    assert m["reward/env"] == pytest.approx(1 / 3)
    err = capsys.readouterr()
    assert (err.out + err.err).count("raised ValueError: cannot score a surrender") == 1  # shown once per term
    assert composer(1, [good])["reward/errors"] == 0.0  # counted per batch


def test_bad_terms_are_refused_with_what_to_do():
    with pytest.raises(ValueError, match="unknown reward term 'sucess'"):
        RewardSpec(terms={"sucess": 1.0})
    with pytest.raises(ValueError, match="strictly increasing"):
        RewardSpec(terms={"env": 1}, stages=[{"from_step": 5, "terms": {"env": 1}}, {"from_step": 5, "terms": {}}])
    with pytest.raises(ConfigError, match="cannot import module 'no_such_mod'"):
        RewardComposer(RewardSpec(terms={"no_such_mod:f": 1.0}))
    with pytest.raises(ConfigError, match="has no 'nothing_here'"):
        RewardComposer(RewardSpec(terms={"envfixtures:nothing_here": 1.0}))
    silent = RewardComposer(RewardSpec(terms={"info.progress": 1.0}))
    with pytest.raises(ConfigError, match=r"fake did not report 'progress'.*reported: \['calls'\]"):
        silent(0, [_episode(1.0, True, 3, 1, info={"calls": 1.0})])
    # episodes that never reached the environment (cut by length) report nothing, and that is fine
    cut = _episode(0.0, False, 3, 1, termination="length")
    silent(0, [cut])
    assert cut.trajectory.metadata["reward_terms"] == {"info.progress": 0.0}


def test_an_rl_run_logs_every_term_and_switches_stage(tmp_path, tiny_dir, turns_end):
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config
    from trajtune.train import run

    out = tmp_path / "rl"
    reward = ("{terms: {env: 1.0, info.calls: 0.5, info.steps: 0.1, 'envfixtures:mentions_done': 1.0}, "
              "stages: [{from_step: 1, terms: {success: 1.0}}]}")
    run(load_config(None, RLRunConfig, [f"model={tiny_dir}", f"output_dir={out}", "env=envfixtures:TermsHome",
                                        f"rl.reward={reward}", "rollout.max_turns=2", "rollout.max_new_tokens=8",
                                        "rl.tasks_per_step=1", "rl.group_size=2", "train.steps=2", "report=false"]),
        quiet=True)
    logs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    eps = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [m["reward_stage"] for m in logs] == [0.0, 1.0]
    for step, m in enumerate(logs, start=1):
        mine = [e for e in eps if e["step"] == step]
        terms = [e["metadata"]["reward_terms"] for e in mine]
        for name in ("env", "success", "info.calls", "info.steps", "envfixtures:mentions_done"):
            assert m[f"reward/{name}"] == pytest.approx(sum(t[name] for t in terms) / len(terms))
        weights = ({"env": 1.0, "info.calls": 0.5, "info.steps": 0.1, "envfixtures:mentions_done": 1.0} if step == 1
                   else {"success": 1.0})
        shaped = [sum(w * t[n] for n, w in weights.items()) for t in terms]
        assert [e["metadata"]["shaped_reward"] for e in mine] == pytest.approx(shaped)
        assert m["reward"] == pytest.approx(sum(shaped) / len(shaped))
    calls = [sum(len(msg.get("tool_calls") or []) for msg in e["messages"]) for e in eps]
    assert [e["metadata"]["reward_terms"]["info.calls"] for e in eps] == pytest.approx(calls, abs=0)
    # the environment's steps: one per assistant turn that reached it (those carry a reward)
    stepped = [sum(1 for msg in e["messages"] if msg["role"] == "assistant" and "reward" in msg) for e in eps]
    assert sum(stepped) > 0
    assert [e["metadata"]["reward_terms"]["info.steps"] for e in eps] == pytest.approx(stepped, abs=0)
