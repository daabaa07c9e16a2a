"""A non-finite reward never reaches the optimizer: RolloutSource + PolicyGradientObjective + Learner."""

from __future__ import annotations

import json
import math
import warnings

import torch

import trajtune.experience as experience
from trajtune.algorithms.policy_gradient import PolicyGradientObjective
from trajtune.chat.render import ChatRenderer
from trajtune.envs import make_env
from trajtune.algorithms.rl import rl_transforms
from trajtune.experience import RolloutSource
from trajtune.learner import Learner, LearnerConfig, set_seed
from trajtune.models.loading import load_model
from trajtune.rollout import Episode, RolloutConfig


def test_an_inf_reward_never_reaches_the_optimizer(tmp_path, tiny_dir, tiny_tok, home_experts, monkeypatch):
    renderer = ChatRenderer(tiny_tok)
    # Two tasks x two samples; one sample of the first task got reward inf from its environment.
    rewards = [1.0, math.inf, 0.0, 1.0]

    def fake_rollouts(model, tok, env_factory, tasks, rollout, seed=0, renderer=None, progress=None):
        eps = []
        for traj, r in zip(home_experts[: len(tasks)], rewards):
            tt = renderer.render(traj)
            tt.reward = r
            tt.logprobs = [0.0] * len(tt)
            eps.append(Episode(trajectory=traj, tokens=tt))
        return eps

    monkeypatch.setattr(experience, "run_rollouts", fake_rollouts)
    env = make_env("home")
    source = RolloutSource(tiny_tok, lambda: make_env("home"), env.tasks("train", 2, seed=0), RolloutConfig(),
                           tasks_per_step=2, group_size=2, renderer=renderer)
    source.per_round, source.per_batch = rl_transforms(estimator="grpo")
    set_seed(0)
    model = load_model(str(tiny_dir))
    learner = Learner(model, tiny_tok, PolicyGradientObjective(), source,
                      LearnerConfig(steps=1, lr=1e-2, micro_batch_size=4), tmp_path)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        learner.fit()
    after = dict(learner.accelerator.unwrap_model(learner.model).named_parameters())
    assert all(torch.isfinite(p).all() for p in after.values())
    assert any("non-finite reward" in str(w.message) for w in caught)
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the finite group still trained
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert row["nonfinite_rewards"] == 1 and math.isfinite(row["loss"]) and math.isfinite(row["reward"])
    assert row["masked_episodes"] == 1  # the inf episode: env_error, weight 0, out of its group's baseline
    trained = row["tokens"]  # policy tokens that carried loss: all but the masked episode's
    tts, _ = source.batch(0, model)
    assert trained == sum(t.n_policy() for t, r in zip(tts, rewards) if math.isfinite(r))
