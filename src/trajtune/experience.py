"""Experience sources: what the learner trains on at each step.

``DatasetSource`` serves rendered trajectories (SFT, RFT); ``RolloutSource`` samples fresh groups
from the current policy in an environment and applies the RL transforms (termination policy,
group advantages, reference log-probs). Both are deterministic functions of the step index.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trajtune.algorithms.grpo import (
    Estimator,
    TerminationPolicy,
    add_ref_logprobs,
    apply_termination_policy,
    assign_advantages,
)
from trajtune.chat.render import ChatRenderer
from trajtune.tokens import TokenTrajectory
from trajtune.envs.base import Environment, Task
from trajtune.rollout import RolloutConfig, run_rollouts


@dataclass
class DatasetSource:
    """SFT experience: a fixed list of TokenTrajectories, reshuffled each epoch from the seed."""

    data: list[TokenTrajectory]
    batch_size: int
    seed: int = 0
    _orders: dict[int, list[int]] = field(default_factory=dict)

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._orders[epoch] = torch.randperm(len(self.data), generator=g).tolist()
        return self._orders[epoch]

    def batch(self, step: int, model: Any) -> tuple[list[TokenTrajectory], dict[str, float]]:
        n = len(self.data)
        if n == 0:
            raise ValueError("the training set is empty")
        out = []
        for k in range(step * self.batch_size, (step + 1) * self.batch_size):
            epoch, pos = divmod(k, n)
            out.append(self.data[self._order(epoch)[pos]])
        return out, {"epoch": (step * self.batch_size) / n}


@dataclass
class RolloutSource:
    """Each step: ``tasks_per_step`` training tasks × ``group_size`` samples from the current model."""

    tokenizer: Any
    env_factory: Callable[[], Environment]
    tasks: list[Task]
    rollout: RolloutConfig
    tasks_per_step: int = 8
    group_size: int = 8
    estimator: Estimator = "grpo"
    drop_equal_groups: bool = False
    termination_policy: dict[str, TerminationPolicy] = field(default_factory=dict)
    ref_model: Any = None
    seed: int = 0
    renderer: ChatRenderer | None = None
    on_episodes: Callable[[int, list[Any]], None] | None = None

    def batch(self, step: int, model: Any) -> tuple[list[TokenTrajectory], dict[str, float]]:
        n = len(self.tasks)
        if n == 0:
            raise ValueError("no training tasks for RL")
        chosen = [self.tasks[(step * self.tasks_per_step + i) % n] for i in range(self.tasks_per_step)]
        expanded = [t for t in chosen for _ in range(self.group_size)]
        episodes = run_rollouts(model, self.tokenizer, self.env_factory, expanded, self.rollout,
                                seed=self.seed * 1_000_003 + step, renderer=self.renderer)
        if self.on_episodes:
            self.on_episodes(step, episodes)
        tts = []
        for k, e in enumerate(episodes):
            tt = e.tokens
            tt.group = f"{step}:{k // self.group_size}"
            tts.append(tt)
        finite = [float(t.reward or 0.0) for t in tts if math.isfinite(float(t.reward or 0.0))]
        metrics = {
            "reward": sum(finite) / max(1, len(finite)),  # non-finite ones are counted by assign_advantages
            "success": sum(1.0 for e in episodes if e.trajectory.outcome and e.trajectory.outcome.success) / len(tts),
            "format_errors": sum(e.format_errors for e in episodes) / len(tts),
            "mean_len": sum(len(t) for t in tts) / len(tts),
        }
        tts = apply_termination_policy(tts, self.termination_policy)
        tts, adv_metrics = assign_advantages(tts, self.estimator, self.drop_equal_groups)
        metrics.update(adv_metrics)
        if adv_metrics["nonfinite_reward_groups"]:
            warnings.warn(f"step {step + 1}: dropped {adv_metrics['nonfinite_reward_groups']:.0f} group(s) with a "
                          "non-finite reward (inf/NaN); check the environment's reward (metrics.jsonl: "
                          "nonfinite_reward_groups)", RuntimeWarning, stacklevel=2)
        if self.ref_model is not None and tts:
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            add_ref_logprobs(self.ref_model, tts, pad, self.rollout.temperature if self.rollout.temperature > 0 else 1.0)
        return tts, metrics
