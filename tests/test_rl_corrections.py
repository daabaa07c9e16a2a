"""RL corrections (docs/algorithms.md): PPO epochs × mini-batches make the clip bind, whole groups per
mini-batch, DAPO dynamic sampling and overlong penalty, REINFORCE++ whitening, masked episodes and
the baseline, and the algorithm-tagged config union."""

from __future__ import annotations


import pytest
import torch

import trajtune.experience as experience
from trajtune.algorithms.batch import collate, token_logprobs
from trajtune.algorithms.advantages import assign_advantages, whiten_advantages
from trajtune.algorithms.episode_transforms import apply_overlong_penalty, apply_termination_policy
from trajtune.algorithms.policy_gradient import PolicyGradientObjective
from trajtune.chat.render import ChatRenderer
from trajtune.algorithms.registry import load_run_config
from trajtune.config import ConfigError
from trajtune.envs import make_env
from trajtune.algorithms.rl import rl_transforms
from trajtune.experience import RolloutSource
from trajtune.learner import Learner, LearnerConfig, set_seed, split_units
from trajtune.models.loading import load_model
from trajtune.rollout import Episode, RolloutConfig
from trajtune.tokens import SOURCE_ENV, SOURCE_POLICY, SOURCE_PROMPT, TokenTrajectory


def _tt(reward, n_policy, group="g", termination="done"):
    src = [SOURCE_PROMPT] + [SOURCE_POLICY] * n_policy + [SOURCE_ENV]
    return TokenTrajectory(ids=list(range(len(src))), source=src, turn=[0] * len(src), weight=[1.0] * len(src),
                           reward=reward, termination=termination, group=group)


def test_reinforce_pp_token_whitening_vector():
    # ALGORITHMS.md: rewards [1, 0, 1] with 4, 12, 1 policy tokens -> [1.503, -0.626, 1.503]
    assert whiten_advantages([1.0, 0.0, 1.0], [4, 12, 1], "token") == pytest.approx([1.503, -0.626, 1.503], abs=1e-3)
    # per trajectory: mean 2/3, unbiased std 0.5774
    assert whiten_advantages([1.0, 0.0, 1.0], [4, 12, 1], "trajectory") == pytest.approx([0.5774, -1.1547, 0.5774],
                                                                                          abs=1e-4)
    tts = [_tt(1.0, 4, "a"), _tt(0.0, 12, "b"), _tt(1.0, 1, "c")]
    kept, _ = assign_advantages(tts, "reinforce_pp", whitening="token")
    assert [t.advantages[1] for t in kept] == pytest.approx([1.503, -0.626, 1.503], abs=1e-3)


def test_masked_episodes_stay_out_of_the_baseline_unless_asked():
    def group():
        return apply_termination_policy([_tt(1.0, 2), _tt(0.0, 2), _tt(0.0, 2, termination="env_error")])

    kept, m = assign_advantages(group(), "dr_grpo")
    # baseline over the two unmasked: mean 0.5 -> ±0.5; the masked one gets 0
    assert [t.advantages[1] for t in kept] == pytest.approx([0.5, -0.5, 0.0]) and m["masked_episodes"] == 1
    kept, _ = assign_advantages(group(), "dr_grpo", masked_in_baseline=True)
    assert [t.advantages[1] for t in kept] == pytest.approx([2 / 3, -1 / 3, 0.0])


def test_overlong_penalty_is_added_from_the_policy_token_count():
    tts = [_tt(1.0, 10), _tt(1.0, 15), _tt(1.0, 30)]  # L = 20, C = 10
    mean = apply_overlong_penalty(tts, 20, 10)
    assert [t.reward for t in tts] == pytest.approx([1.0, 0.5, 0.0]) and mean == pytest.approx(-0.5)


def test_mini_batches_hold_whole_groups_and_cover_the_batch(tmp_path, tiny_dir, tiny_tok, home_experts):
    tts = [_tt(float(i % 2), 2, group=f"g{i // 3}") for i in range(12)]  # 4 groups of 3
    model = load_model(str(tiny_dir))
    cfg = LearnerConfig(steps=1, micro_batch_size=2, epochs=2, mini_batches=3, seed=5)
    learner = Learner(model, tiny_tok, PolicyGradientObjective(), None, cfg, tmp_path)
    for epoch in (0, 1):
        parts = learner._mini_batches(tts, epoch)
        assert len(parts) == 3
        assert sorted(id(t) for p in parts for t in p) == sorted(id(t) for t in tts)
        for p in parts:  # every group lies entirely in one mini-batch
            for g in {t.group for t in p}:
                assert sum(t.group == g for t in p) == 3
    assert learner._mini_batches(tts, 1) == learner._mini_batches(tts, 1)  # seeded: same order on replay
    # coupled rows (DPO pairs): micro-batches never split a unit, even when the unit is larger than one
    learner.objective = type("Coupled", (), {"coupled_rows": True})()
    micro = learner._micro_batches(tts)
    assert all(len({t.group for t in mb}) == 1 and len(mb) == 3 for mb in micro)
    assert [len(u) for u in split_units(tts)] == [3, 3, 3, 3]
    # pairs of different lengths, grouped by length: still whole, chosen before rejected, longest first
    pairs = [_tt(1.0 - k % 2, 2 + 3 * (k // 2) % 7, group=f"p{k // 2}") for k in range(8)]
    learner.cfg.group_by_length, learner.cfg.micro_batch_size = True, 4
    micro = learner._micro_batches(pairs)
    assert sorted(id(t) for mb in micro for t in mb) == sorted(id(t) for t in pairs)
    pos = {id(t): i for i, t in enumerate(pairs)}
    for mb in micro:
        assert all(len(u) == 2 and pos[id(u[0])] % 2 == 0 and pos[id(u[1])] == pos[id(u[0])] + 1
                   for u in split_units(mb))
    lengths = [max(len(t) for t in u) for mb in micro for u in split_units(mb)]
    assert lengths == sorted(lengths, reverse=True)


def _sampled(model, tiny_tok, trajs):
    """Rendered expert trajectories carrying the current model's own log-probs (π_old = π_θ)."""
    r = ChatRenderer(tiny_tok)
    tts = []
    for k, t in enumerate(trajs):
        tt = r.render(t)
        tt.group, tt.reward = f"g{k // 2}", float(k % 2)
        tts.append(tt)
    b = collate(tts, tiny_tok.pad_token_id or 0)
    with torch.no_grad():
        lp, _ = token_logprobs(model, b)
    for row, tt in enumerate(tts):
        tt.logprobs = [0.0] + lp[row, : len(tt) - 1].tolist()
    kept, _ = assign_advantages(tts, "grpo")
    return kept


@pytest.mark.parametrize("epochs,mini", [(1, 1), (2, 1), (1, 2)])
def test_ppo_updates_make_the_ratio_leave_one_and_the_clip_bind(tmp_path, tiny_dir, tiny_tok, home_experts,
                                                               epochs, mini):
    set_seed(0)
    model = load_model(str(tiny_dir), dtype="float32")
    tts = _sampled(model, tiny_tok, home_experts[:8])
    cfg = LearnerConfig(steps=1, lr=5e-2, micro_batch_size=4, epochs=epochs, mini_batches=mini,
                        schedule="constant", max_grad_norm=1e9)
    learner = Learner(model, tiny_tok, PolicyGradientObjective(clip_low=0.2, clip_high=0.2), None, cfg,
                      tmp_path / f"{epochs}x{mini}")
    m = learner.train_step(tts)
    if epochs * mini == 1:  # one update on fresh samples: ρ = 1 exactly, nothing clipped
        assert m["ratio"] == pytest.approx(1.0, abs=1e-5) and m["clip_frac"] == 0.0 and "updates" not in m
    else:
        assert m["updates"] == epochs * mini
        assert m["clip_frac"] > 0.0 and abs(m["ratio"] - 1.0) > 1e-3


def _fake_rollouts(reward_of):
    """run_rollouts stand-in: each episode's reward from reward_of(task id, sample index in its group)."""

    def fake(model, tok, env_factory, tasks, rollout, seed=0, renderer=None, progress=None):
        eps = []
        env = env_factory()
        for k, task in enumerate(tasks):
            traj = env.expert(task)
            tt = renderer.render(traj)
            tt.reward = reward_of(task.id, k)
            tt.logprobs = [0.0] * len(tt)
            eps.append(Episode(trajectory=traj, tokens=tt, task=task))
        return eps

    return fake


def test_dynamic_sampling_resamples_until_the_batch_has_informative_groups(tiny_tok, monkeypatch):
    env = make_env("home")
    tasks = env.tasks("train", 12, seed=0)
    informative = {t.id for t in tasks[6:]}  # the first round's tasks (0..3) all give equal rewards
    monkeypatch.setattr(experience, "run_rollouts",
                        _fake_rollouts(lambda tid, k: float(k % 2) if tid in informative else 1.0))

    def source(max_rounds):
        s = RolloutSource(tiny_tok, lambda: make_env("home"), tasks, RolloutConfig(), tasks_per_step=4,
                          group_size=2, min_groups=4, max_rounds=max_rounds, renderer=ChatRenderer(tiny_tok), seed=1)
        s.per_round, s.per_batch = rl_transforms(drop_equal_groups=True)
        return s

    tts, m = source(20).batch(0, None)
    assert m["sampling_rounds"] > 1 and m["kept_groups"] == 4
    assert len(tts) == 8 and all(t.traj_id in informative for t in tts)
    assert any(a != 0 for t in tts for a in t.advantages)
    again, m2 = source(20).batch(0, None)  # a function of (seed, step, round): replay gives the same batch
    assert [t.group for t in again] == [t.group for t in tts] and m2["sampling_rounds"] == m["sampling_rounds"]
    capped, m3 = source(1).batch(0, None)  # the cap: one round, no informative group, nothing to train
    assert m3["sampling_rounds"] == 1 and capped == [] and m3["equal_reward_groups"] == 4


def test_algorithm_tag_picks_the_config_and_commands_refuse_another(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("algorithm: rl\nmodel: m\noutput_dir: o\nenv: home\nrl: {ppo_epochs: 2, mini_batches: 2}\n")
    cfg = load_run_config(p)
    assert type(cfg).__name__ == "RLRunConfig" and cfg.rl.ppo_epochs == 2
    with pytest.raises(ConfigError, match="not a sft config.*trajtune train"):
        load_run_config(p, algorithm="sft")
    p.write_text("model: m\noutput_dir: o\ndata: {path: d.jsonl}\n")
    assert load_run_config(p, algorithm="sft").algorithm == "sft"
    with pytest.raises(ConfigError, match="no `algorithm:` key"):
        load_run_config(p)
    with pytest.raises(ConfigError, match="unknown algorithm 'ppo'"):
        load_run_config(p, ["algorithm=ppo"])
    bad = tmp_path / "b.yaml"
    for extra, msg in [("rl: {mini_batches: 9, tasks_per_step: 8}", "mini_batches"),
                       ("rl: {overlong: {max_length: 10, cache: 20}}", "cache must not exceed"),
                       ("rl: {whitening: trajectory}", "only applies to the reinforce_pp"),
                       ("rl: {termination: {lenght: drop}}", "unknown termination")]:
        bad.write_text(f"algorithm: rl\nmodel: m\noutput_dir: o\nenv: home\n{extra}\n")
        with pytest.raises(ConfigError, match=msg):
            load_run_config(bad)
