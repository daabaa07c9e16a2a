"""GiGPO (rl.credit: gigpo): step groups from anchor states, the step advantage added to the
episode's, hand-computed on episodes that share and revisit states; and the bandit in which the
agent decides the episode length, where the estimator must not favour short or long episodes."""

from __future__ import annotations

import copy
import json
import random
import statistics
from collections import defaultdict

import pytest

from trajtune.algorithms.advantages import assign_advantages, assign_turn_advantages
from trajtune.algorithms.gigpo import anchor_keys, assign_gigpo_advantages
from trajtune.tokens import SOURCE_ENV, SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory

PROMPT = [1, 2]


def _episode(name: str, steps: list[tuple[int, list[int]]], reward: float, group: str = "g",
             turn_rewards: list[float] | None = None) -> TokenTrajectory:
    """An episode from (action token, observation tokens) per turn; the last turn's observation is
    empty when the episode ends on an answer."""
    ids, source, turn = list(PROMPT), [SOURCE_PROMPT] * len(PROMPT), [0] * len(PROMPT)
    for k, (action, obs) in enumerate(steps):
        ids += [action, action]  # two policy tokens a turn
        source += [SOURCE_POLICY] * 2
        turn += [k, k]
        ids += obs
        source += [SOURCE_ENV] * len(obs)
        turn += [k + 1] * len(obs)
    return TokenTrajectory(ids=ids, source=source, turn=turn, weight=[float(s == SOURCE_POLICY) for s in source],
                           traj_id=name, group=group, reward=reward,
                           meta={"turn_rewards": turn_rewards} if turn_rewards is not None else {})


def _by_turn(t: TokenTrajectory) -> list[float]:
    out: dict[int, set[float]] = {}
    for a, s, k in zip(t.advantages or [], t.source, t.turn):
        if s == SOURCE_POLICY:
            out.setdefault(k, set()).add(round(a, 6))
        else:
            assert a == 0.0  # prompt and observation tokens carry no advantage
    assert all(len(v) == 1 for v in out.values())
    return [out[k].pop() for k in sorted(out)]


def test_anchor_keys_are_the_observation_history_or_the_last_observation():
    a = _episode("a", [(10, [20, 21]), (11, [22]), (12, [])], 1.0)
    b = _episode("b", [(13, [20, 21]), (14, [23]), (12, [])], 0.0)  # other actions, same first observation
    c = _episode("c", [(10, [22]), (11, [22]), (12, [])], 0.0)
    ha, hb, hc = (anchor_keys(t, "history") for t in (a, b, c))
    assert set(ha) == {0, 1, 2}
    assert ha[0] == hb[0] == hc[0]  # every episode starts from the prompt
    assert ha[1] == hb[1] != hc[1]  # the policy's own tokens are not part of the state
    assert ha[2] != hb[2]
    la, lc = anchor_keys(a, "last"), anchor_keys(c, "last")
    assert la[0] == ha[0]  # at turn 0 the last thing that came back is the prompt
    assert lc[1] == lc[2] == la[2]  # [22] at turn 1 and 2 of c, and at turn 2 of a: one state
    assert anchor_keys(c, "history")[1] != anchor_keys(c, "history")[2]


def test_four_episodes_get_the_hand_computed_step_groups_and_advantages():
    # γ = 0.5, Dr. GRPO (mean only), ω = 1, reward only at the end
    e1 = _episode("e1", [(10, [20]), (11, [30]), (12, [])], 1.0)  # returns (0.25, 0.5, 1)
    e2 = _episode("e2", [(13, [20]), (14, [31]), (12, [])], 0.0)  # (0, 0, 0)
    e3 = _episode("e3", [(10, [21]), (12, [])], 1.0)  # (0.5, 1)
    e4 = _episode("e4", [(15, [20]), (11, [30]), (12, [])], 1.0)  # (0.25, 0.5, 1)
    _, m = assign_gigpo_advantages([e1, e2, e3, e4], "dr_grpo", gamma=0.5, step_weight=1.0)
    # episode: mean R 0.75 → (0.25, −0.75, 0.25, 0.25)
    # turn 0, all four (prompt): returns (0.25, 0, 0.5, 0.25), mean 0.25 → (0, −0.25, 0.25, 0)
    # turn 1, e1 e2 e4 after [20]: (0.5, 0, 0.5), mean 1/3 → (1/6, −1/3, 1/6); e3 after [21] alone → 0
    # turn 2, e1 e4 after [20][30]: (1, 1) → 0; e2 after [20][31] alone → 0
    assert _by_turn(e1) == _by_turn(e4) == pytest.approx([0.25, 0.25 + 1 / 6, 0.25], abs=1e-6)
    assert _by_turn(e2) == pytest.approx([-1.0, -0.75 - 1 / 3, -0.75], abs=1e-6)
    assert _by_turn(e3) == pytest.approx([0.5, 0.25], abs=1e-6)
    assert e1.meta["anchor_group_sizes"] == [4, 3, 2] and e3.meta["anchor_group_sizes"] == [4, 1]
    assert e1.meta["turn_advantages"] == pytest.approx(_by_turn(e1), abs=1e-6)
    assert m["gigpo/step_groups"] == 3.0  # turn 0, turn 1 after [20], turn 2 after [20][30]
    assert m["gigpo/anchored_steps"] == pytest.approx(9 / 11)  # 11 steps, 2 alone


def test_a_revisited_state_joins_its_step_group_only_with_the_last_observation_anchor():
    # l1 loops (its second call changes nothing: the same observation again) and fails; l2 succeeds
    l1 = _episode("l1", [(10, [20]), (11, [20]), (12, [])], 0.0)  # γ 0.5 returns (0, 0, 0)
    l2 = _episode("l2", [(11, [20]), (12, [])], 1.0)  # (0.5, 1)
    assign_gigpo_advantages([l1, l2], "dr_grpo", gamma=0.5, anchor="last")
    # episode (−0.5, 0.5); turn 0: (0, 0.5) → (−0.25, 0.25); state [20]: l1 t1, l1 t2, l2 t1 with
    # returns (0, 0, 1), mean 1/3 → (−1/3, −1/3, 2/3)
    assert _by_turn(l1) == pytest.approx([-0.75, -0.5 - 1 / 3, -0.5 - 1 / 3], abs=1e-6)
    assert _by_turn(l2) == pytest.approx([0.75, 0.5 + 2 / 3], abs=1e-6)
    assert l1.meta["anchor_group_sizes"] == [2, 3, 3]
    assign_gigpo_advantages([l1, l2], "dr_grpo", gamma=0.5, anchor="history")
    # history: l1 t1 and l2 t1 share [20] → (0, 1) → (−0.5, 0.5); l1 t2 ([20][20]) is alone → 0
    assert _by_turn(l1) == pytest.approx([-0.75, -1.0, -0.5], abs=1e-6)
    assert _by_turn(l2) == pytest.approx([0.75, 1.0], abs=1e-6)


def test_with_outcome_reward_and_no_discount_turn_zero_doubles_the_grpo_advantage():
    # every episode starts from the prompt, and with γ = 1 its return there is the episode reward,
    # so the step advantage at turn 0 equals the episode advantage, for any estimator
    rng = random.Random(3)
    for estimator in ("grpo", "dr_grpo", "rloo"):
        eps = [_episode(f"e{i}", [(10 + rng.randrange(3), [20 + rng.randrange(2)]) for _ in range(rng.randrange(1, 4))]
                        + [(12, [])], float(rng.randrange(2))) for i in range(6)]
        eps[0].reward, eps[1].reward = 1.0, 0.0
        ref = copy.deepcopy(eps)
        assign_advantages(ref, estimator)  # type: ignore[arg-type]
        assign_gigpo_advantages(eps, estimator, gamma=1.0, step_weight=0.5)  # type: ignore[arg-type]
        for t, r in zip(eps, ref):
            assert _by_turn(t)[0] == pytest.approx(1.5 * _by_turn(r)[0], abs=1e-5)


def test_masked_episodes_get_zero_and_stay_out_of_the_step_groups():
    e1 = _episode("e1", [(10, [20]), (12, [])], 1.0)
    e2 = _episode("e2", [(11, [20]), (12, [])], 0.0)
    bad = _episode("bad", [(13, [20]), (12, [])], 5.0)
    bad.meta["masked"] = True
    assign_gigpo_advantages([e1, e2, bad], "dr_grpo")
    assert _by_turn(e1) == [1.0, 1.0] and _by_turn(e2) == [-1.0, -1.0]  # (0.5 + 0.5, ...)
    assert _by_turn(bad) == [0.0, 0.0]
    assert e1.meta["anchor_group_sizes"] == [2, 2]


def _bandit_episode(rng: random.Random, group: int, i: int, max_turns: int = 3, c: float = 2.0,
                    markov: bool = True) -> TokenTrajectory:
    """Each turn the agent continues (token 10; reward 1, observation "step k+1") or stops (11;
    reward c − depth ± 0.5). Every episode's total is c ± 0.5 whatever it does, so no decision is
    better than another and an unbiased estimator gives continuing and stopping the same mean
    advantage. ``markov`` False: the observation is the same at every depth, so it is not the
    whole state (the remaining return depends on the depth)."""
    steps, rewards = [], []
    for k in range(max_turns):
        stop = k == max_turns - 1 or rng.random() < 0.5
        if stop:
            steps.append((11, []))
            rewards.append(c - k + rng.choice((-0.5, 0.5)))
            break
        steps.append((10, [20 + (k + 1) * markov]))
        rewards.append(1.0)
    t = _episode(f"{group}-{i}", steps, sum(rewards), group=str(group), turn_rewards=rewards)
    t.meta["acts"] = ["stop" if a == 11 else "continue" for a, _ in steps]
    return t


def _per_index_normalised(members: list[TokenTrajectory]) -> None:
    """The naive per-turn estimator (MT-GRPO style): each turn's reward minus the mean reward of the
    group's episodes at that turn index, summed over the turns that follow. Its baseline has as
    many terms as the episode has turns, which its own decisions set."""
    rewards = [t.meta["turn_rewards"] for t in members]
    depth = max(map(len, rewards))
    means = [statistics.mean(r[j] for r in rewards if len(r) > j) for j in range(depth)]
    for t, r in zip(members, rewards):
        t.meta["turn_advantages"] = [sum(r[j] - means[j] for j in range(k, len(r))) for k in range(len(r))]


def _length_bias(tts: list[TokenTrajectory], depth: int) -> float:
    """Mean advantage of "continue" minus that of "stop" at ``depth``."""
    by: dict[str, list[float]] = defaultdict(list)
    for t in tts:
        if len(t.meta["acts"]) > depth:
            by[t.meta["acts"][depth]].append(t.meta["turn_advantages"][depth])
    return statistics.mean(by["continue"]) - statistics.mean(by["stop"])


def test_the_estimator_is_not_biased_toward_short_or_long_episodes():
    rng = random.Random(0)
    tts = [_bandit_episode(rng, g, i) for g in range(1000) for i in range(8)]
    naive = copy.deepcopy(tts)
    groups: dict[str, list[TokenTrajectory]] = defaultdict(list)
    for t in naive:
        groups[t.group].append(t)
    for members in groups.values():
        _per_index_normalised(members)
    # the detector works: the naive estimator penalises continuing by about the mean intermediate reward
    assert _length_bias(naive, 0) < -0.5
    for estimator in ("dr_grpo", "grpo"):
        for anchor in ("history", "last"):
            gi = copy.deepcopy(tts)
            assign_gigpo_advantages(gi, estimator, gamma=1.0, anchor=anchor)  # type: ignore[arg-type]
            for depth in (0, 1):  # standard error of the difference ≈ 0.02 (dr_grpo) / 0.04 (grpo) here
                assert abs(_length_bias(gi, depth)) < (0.08 if estimator == "dr_grpo" else 0.15), (estimator, anchor)
    turn = copy.deepcopy(tts)
    assign_turn_advantages(turn, "dr_grpo", 1.0)  # the existing turn credit compares returns, not rewards
    assert abs(_length_bias(turn, 0)) < 0.08


def test_the_last_observation_anchor_needs_observations_that_are_the_whole_state():
    # the same observation at every depth: `last` puts depth 1 and depth 2 in one step group though
    # their remaining returns differ by 1, which biases the decision at depth 1; `history` does not
    rng = random.Random(0)
    tts = [_bandit_episode(rng, g, i, markov=False) for g in range(1000) for i in range(8)]
    last, history = copy.deepcopy(tts), copy.deepcopy(tts)
    assign_gigpo_advantages(last, "dr_grpo", gamma=1.0, anchor="last")
    assign_gigpo_advantages(history, "dr_grpo", gamma=1.0, anchor="history")
    assert abs(_length_bias(last, 1)) > 0.1
    assert abs(_length_bias(history, 1)) < 0.08


def test_config_checks_and_an_rl_run_with_gigpo(tmp_path, tiny_dir):
    from trajtune.algorithms.rl import RLRunConfig
    from trajtune.config import load_config
    from trajtune.errors import ConfigError
    from trajtune.train import run

    base = [f"model={tiny_dir}", "env=home", "output_dir=o"]
    with pytest.raises(ConfigError, match="rl.gigpo only applies to credit: gigpo"):
        load_config(None, RLRunConfig, base + ["rl.gigpo.step_weight=0.5"])
    with pytest.raises(ConfigError, match="credit: gigpo works with the group estimators"):
        load_config(None, RLRunConfig, base + ["rl.credit=gigpo", "rl.estimator=reinforce_pp"])
    with pytest.raises(ConfigError, match="anchor"):
        load_config(None, RLRunConfig, base + ["rl.credit=gigpo", "rl.gigpo.anchor=state"])
    with pytest.raises(ConfigError, match="step_weight"):
        load_config(None, RLRunConfig, base + ["rl.credit=gigpo", "rl.gigpo.step_weight=0"])
    out = tmp_path / "rl"
    cfg = load_config(None, RLRunConfig, [f"model={tiny_dir}", "env=home", f"output_dir={out}", "rl.credit=gigpo",
                                          "rl.gamma=0.9", "rl.gigpo.anchor=last", "rollout.max_turns=2",
                                          "rollout.max_new_tokens=8", "rl.tasks_per_step=1", "rl.group_size=3",
                                          "train.steps=1", "report=false"])
    run(cfg, quiet=True)
    eps = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(eps) == 3
    for e in eps:
        turns = sum(1 for m in e["messages"] if m["role"] == "assistant")
        assert len(e["metadata"]["turn_advantages"]) == turns
        assert e["metadata"]["anchor_group_sizes"][0] == 3  # all three start from the task's prompt
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("gigpo/step_groups" in r and r["gigpo/step_groups"] >= 1 for r in metrics)
