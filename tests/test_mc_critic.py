"""rl.credit: mc_critic: V(s_k) = mean discounted return of M rollouts from the state before turn k
(reached by replay), then turn-level GAE on each turn's policy tokens (ALGORITHMS.md, turn-level credit (c))."""

from __future__ import annotations

import json

import pytest

from trajtune.algorithms.mc_critic import MCCritic, MCCriticSpec, assign_mc_advantages, discounted, gae, state_prefixes
from trajtune.rollout import Episode, RolloutConfig
from trajtune.schema import Message, ToolCall, Trajectory
from trajtune.tokens import SOURCE_ENV, SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory


def test_gae_with_known_numbers():
    r, v = [0.0, 0.0, 1.0], [0.5, 0.25, 0.75]
    assert gae(r, v, 1.0, 1.0) == pytest.approx([0.5, 0.75, 0.25])          # G_k − V_k
    # δ = (−0.25, 0.5, 0.25); λ = 0.5: A_2 = 0.25, A_1 = 0.5 + 0.125, A_0 = −0.25 + 0.3125
    assert gae(r, v, 1.0, 0.5) == pytest.approx([0.0625, 0.625, 0.25])
    assert gae(r, v, 0.9, 1.0) == pytest.approx([0.81 - 0.5, 0.9 - 0.25, 1.0 - 0.75])
    assert discounted([1.0, 0.0, 2.0], 0.5) == pytest.approx(1.5)


def _traj(n_turns: int) -> Trajectory:
    msgs = [Message(role="system", content="s"), Message(role="user", content="u")]
    for k in range(n_turns):
        msgs += [Message(role="assistant", tool_calls=[ToolCall(id=f"c{k}", name="f", arguments={})]),
                 Message(role="tool", tool_call_id=f"c{k}", name="f", content="ok")]
    return Trajectory(id="e", messages=msgs)


def _tokens(turn_rewards: list[float], reward: float | None = None) -> TokenTrajectory:
    ids, src, turn = [1], [SOURCE_PROMPT], [0]
    for k in range(len(turn_rewards)):
        ids += [2, 2, 3]
        src += [SOURCE_POLICY, SOURCE_POLICY, SOURCE_ENV]
        turn += [k, k, k + 1]
    return TokenTrajectory(ids=ids, source=src, turn=turn, weight=[float(s == SOURCE_POLICY) for s in src],
                           reward=sum(turn_rewards) if reward is None else reward, meta={"turn_rewards": turn_rewards})


def test_states_are_the_conversation_before_each_turn():
    t = _traj(3)
    assert [len(p) for p in state_prefixes(t.messages, 3)] == [2, 4, 6]
    assert [len(p) for p in state_prefixes(t.messages, 2)] == [2, 4]


def test_values_are_mean_returns_of_rollouts_from_each_state(monkeypatch):
    import trajtune.rollout as rollout

    calls = []

    def fake(model, tok, env_factory, tasks, cfg, seed=0, renderer=None, prefixes=None, **kw):
        calls.append((cfg.max_turns, [len(p) for p in prefixes]))
        out = []
        for j, p in enumerate(prefixes):  # from deeper states the policy does better; one sample of two fails
            r = [0.0, 1.0] if len(p) >= 4 and j % 2 == 0 else [0.5]
            out.append(Episode(trajectory=Trajectory(id="r"), tokens=_tokens(r)))
        return out

    monkeypatch.setattr(rollout, "run_rollouts", fake)
    critic = MCCritic(MCCriticSpec(samples=2), 0.5, None, RolloutConfig(max_turns=4), None, None)
    ep = Episode(trajectory=_traj(3), tokens=_tokens([0.0, 0.0, 1.0]), turns=3)
    m = critic(0, [ep], model=None)
    # one call per depth, the turns left, M = 2 rollouts per state
    assert calls == [(4, [2, 2]), (3, [4, 4]), (2, [6, 6])]
    # s_0: both rollouts return 0.5; s_1, s_2: (0 + 0.5·1 = 0.5, and 0.5) → 0.5 each
    assert ep.tokens.meta["mc_values"] == pytest.approx([0.5, 0.5, 0.5])
    assert m == {"mc_rollouts": 6.0, "mc_value_mean": pytest.approx(0.5)}
    tts, _ = assign_mc_advantages([ep.tokens], gamma=0.5, lam=1.0)
    # G = (0.25, 0.5, 1) − V
    expected = [-0.25, 0.0, 0.5]
    assert ep.tokens.meta["turn_advantages"] == pytest.approx(expected)
    by_token = [(a, k) for a, s, k in zip(tts[0].advantages, tts[0].source, tts[0].turn) if s == SOURCE_POLICY]
    assert all(a == pytest.approx(expected[k]) for a, k in by_token)
    assert all(a == 0.0 for a, s in zip(tts[0].advantages, tts[0].source) if s != SOURCE_POLICY)


def test_masked_episodes_get_no_advantage():
    t = _tokens([1.0])
    t.meta.update({"masked": True, "mc_values": [0.2]})
    assign_mc_advantages([t])
    assert set(t.advantages) == {0.0}


def test_config_refusals_and_an_rl_run(tmp_path, tiny_dir):
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config
    from trajtune.errors import ConfigError
    from trajtune.train import run

    base = [f"model={tiny_dir}", "env=home"]
    for sets, match in ((["rl.mc_critic={samples: 2}"], "only applies to credit: mc_critic"),
                        (["rl.credit=mc_critic", "rl.estimator=rloo"], "own advantages")):
        with pytest.raises(ConfigError, match=match):
            load_config(None, RLRunConfig, base + ["output_dir=o", *sets])
    with pytest.raises(ConfigError, match="not deterministic"):
        run(load_config(None, RLRunConfig, [f"model={tiny_dir}", "env=envfixtures:CoinLevels", "train.steps=1",
                                            f"output_dir={tmp_path / 'b'}", "rl.credit=mc_critic",
                                            "rl.tasks_per_step=1", "rl.group_size=2"]), quiet=True)
    assert not (tmp_path / "b").exists()
    out = tmp_path / "rl"
    run(load_config(None, RLRunConfig, base + [f"output_dir={out}", "rl.credit=mc_critic", "rl.mc_critic={samples: 2}",
                                               "rollout.max_turns=2", "rollout.max_new_tokens=8", "rl.tasks_per_step=1",
                                               "rl.group_size=2", "train.steps=1", "report=false"]), quiet=True)
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    eps = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    turns = [len(e["metadata"]["mc_values"]) for e in eps]
    assert row["mc_rollouts"] == 2 * sum(turns) and all(t >= 1 for t in turns)
    for e in eps:
        assert len(e["metadata"]["turn_advantages"]) == len(e["metadata"]["mc_values"])


def test_rollout_rewards_get_the_same_shaping_as_the_episodes(monkeypatch):
    import trajtune.rollout as rollout

    def fake(model, tok, env_factory, tasks, cfg, seed=0, renderer=None, prefixes=None, **kw):
        return [Episode(trajectory=Trajectory(id="r"), tokens=_tokens([0.0, 1.0] if j % 2 == 0 else [0.5]))
                for j, _ in enumerate(prefixes)]

    calls = []

    def shape(step, eps):  # e.g. reward composition: every rollout's training reward becomes 2; one is masked
        calls.append(len(eps))
        for j, e in enumerate(eps):
            e.tokens.reward = 2.0
            if len(calls) == 2 and j == 1:  # the second state's second rollout: an environment error
                e.tokens.meta["masked"] = True

    monkeypatch.setattr(rollout, "run_rollouts", fake)
    critic = MCCritic(MCCriticSpec(samples=2), 0.5, None, RolloutConfig(max_turns=4), None, None, shape=shape)
    ep = Episode(trajectory=_traj(2), tokens=_tokens([0.0, 1.0]), turns=2)
    critic(0, [ep], model=None)
    # shaped turn rewards (0, 2) → 0.5·2 = 1 and (2) → 2; the second state's second rollout is masked
    assert calls == [2, 2] and ep.tokens.meta["mc_values"] == pytest.approx([1.5, 1.0])
