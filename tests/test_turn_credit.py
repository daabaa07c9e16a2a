"""Turn-level credit (rl.credit: turn): per-turn discounted returns, compared across the group's turns
at the same depth, on each turn's policy tokens (ALGORITHMS.md, Turn-level credit (b))."""

from __future__ import annotations

import json

import pytest

from trajtune.algorithms.advantages import assign_turn_advantages, turn_returns
from trajtune.algorithms.episode_transforms import apply_termination_policy
from trajtune.tokens import SOURCE_ENV, SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory


def _episode(name: str, turn_rewards: list[float], per_turn: int = 2, reward: float | None = None,
             termination: str = "done") -> TokenTrajectory:
    ids, source, turn = [1, 2], [SOURCE_PROMPT] * 2, [0, 0]
    for k in range(len(turn_rewards)):
        ids += [3] * per_turn + [4]
        source += [SOURCE_POLICY] * per_turn + [SOURCE_ENV]
        turn += [k] * per_turn + [k + 1]
    return TokenTrajectory(ids=ids, source=source, turn=turn, weight=[float(s == SOURCE_POLICY) for s in source],
                           traj_id=name, group="g", reward=sum(turn_rewards) if reward is None else reward,
                           termination=termination, meta={"turn_rewards": turn_rewards})


def _by_turn(t: TokenTrajectory) -> dict[int, float]:
    out: dict[int, set[float]] = {}
    for a, s, k in zip(t.advantages, t.source, t.turn):
        if s == SOURCE_POLICY:
            out.setdefault(k, set()).add(a)
        else:
            assert a == 0.0  # prompt and observation tokens carry no advantage
    assert all(len(v) == 1 for v in out.values())  # one value per turn
    return {k: v.pop() for k, v in out.items()}


def test_three_turn_episodes_get_the_hand_computed_advantages():
    e1, e2, e3 = _episode("a", [0.5, 0.0, 1.0]), _episode("b", [0.0, 0.0, 0.0]), _episode("c", [0.0, 1.0])
    # γ = 0.9: e1 returns (0.5 + 0.9·0.9, 0.9, 1) = (1.31, 0.9, 1); e2 (0, 0, 0); e3 (0.9, 1)
    assert turn_returns(e1, 0.9) == pytest.approx([1.31, 0.9, 1.0])
    assert turn_returns(e3, 0.9) == pytest.approx([0.9, 1.0])
    assign_turn_advantages([e1, e2, e3], "dr_grpo", gamma=0.9)
    # Dr. GRPO per depth: depth 0 mean 2.21/3, depth 1 mean 1.9/3, depth 2 (e1, e2 only) mean 0.5
    assert _by_turn(e1) == pytest.approx({0: 1.31 - 2.21 / 3, 1: 0.9 - 1.9 / 3, 2: 0.5})
    assert _by_turn(e2) == pytest.approx({0: -2.21 / 3, 1: -1.9 / 3, 2: -0.5})
    assert _by_turn(e3) == pytest.approx({0: 0.9 - 2.21 / 3, 1: 1.0 - 1.9 / 3})
    assert e1.meta["turn_advantages"] == pytest.approx([1.31 - 2.21 / 3, 0.9 - 1.9 / 3, 0.5], abs=1e-6)


def test_rloo_and_grpo_per_depth_and_a_depth_reached_once():
    e1, e2, e3 = _episode("a", [1.0, 0.0]), _episode("b", [0.0, 0.0]), _episode("c", [0.0])
    assign_turn_advantages([e1, e2, e3], "rloo", gamma=1.0)
    # depth 0 returns (1, 0, 0): RLOO = 3/2·(r − 1/3); depth 1 returns (0, 0): 0
    assert _by_turn(e1) == pytest.approx({0: 1.0, 1: 0.0})
    assert _by_turn(e3) == pytest.approx({0: -0.5})
    lone = [_episode("a", [0.0, 1.0, 0.0]), _episode("b", [1.0])]
    assign_turn_advantages(lone, "grpo", gamma=1.0)
    # depth 0: returns (1, 1): equal ⇒ 0; depths 1, 2 reached by one episode only ⇒ 0
    assert _by_turn(lone[0]) == {0: 0.0, 1: 0.0, 2: 0.0}


def test_gamma_one_makes_the_first_return_the_episode_reward_after_termination_policy():
    cut = _episode("a", [1.0, 0.0], termination="length")  # default policy: zero_reward
    ok = _episode("b", [0.0, 0.5])
    apply_termination_policy([cut, ok])
    assert cut.reward == 0.0
    assert turn_returns(cut, 1.0) == [0.0, -1.0]  # the reward change lands on the turn that ended it
    assert turn_returns(ok, 1.0)[0] == ok.reward


def test_masked_episodes_get_zero_and_stay_out_of_the_statistics():
    e1, e2, bad = _episode("a", [1.0]), _episode("b", [0.0]), _episode("c", [5.0])
    bad.meta["masked"] = True
    bad.weight = [0.0] * len(bad.weight)
    _, m = assign_turn_advantages([e1, e2, bad], "dr_grpo")
    assert _by_turn(e1) == {0: 0.5} and _by_turn(bad) == {0: 0.0} and m["masked_episodes"] == 1.0


def test_config_checks_and_an_rl_run_with_turn_credit(tmp_path, tiny_dir):
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config
    from trajtune.errors import ConfigError
    from trajtune.train import run

    base = [f"model={tiny_dir}", "env=home"]
    with pytest.raises(ConfigError, match="gamma only applies"):
        load_config(None, RLRunConfig, base + ["output_dir=o", "rl.gamma=0.9"])
    with pytest.raises(ConfigError, match="group estimators"):
        load_config(None, RLRunConfig, base + ["output_dir=o", "rl.credit=turn", "rl.estimator=reinforce_pp"])
    out = tmp_path / "rl"
    run(load_config(None, RLRunConfig, base + [f"output_dir={out}", "rl.credit=turn", "rl.gamma=0.9",
                                               "rollout.max_turns=2", "rollout.max_new_tokens=8", "rl.tasks_per_step=1",
                                               "rl.group_size=2", "train.steps=1", "report=false"]), quiet=True)
    eps = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(eps) == 2
    for e in eps:
        turns = sum(1 for m in e["messages"] if m["role"] == "assistant")
        assert len(e["metadata"]["turn_advantages"]) == turns
        assert e["metadata"]["advantage"] == pytest.approx(e["metadata"]["turn_advantages"][0], abs=1e-6)
