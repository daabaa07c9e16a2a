"""The policy-gradient objective of online RL: the clipped surrogate with an optional KL penalty to
a reference, and its token aggregations (docs/algorithms.md, Objective).

The loss mask is source == policy (``Batch.loss_mask``), so observation and prompt tokens never
carry loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from trajtune.algorithms.base import Metrics
from trajtune.algorithms.batch import Batch, by_adapter, token_logprobs

Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


@dataclass
class PolicyGradientObjective:
    """Clipped surrogate ℓ_t = max(−A ρ, −A clip(ρ, 1−ε_low, 1+ε_high)), log ρ clamped to [−20, 20],
    plus β·KL(k1|k2|k3) to a reference when ``kl_coef`` > 0, aggregated as configured."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    aggregation: Aggregation = "token_mean"
    norm_length: float = 1024.0  # constant for seq_mean_token_sum_norm (Dr. GRPO)
    temperature: float = 1.0
    name: str = "policy_gradient"

    def _mask(self, batch: Batch) -> torch.Tensor:
        return batch.loss_mask()

    def denominator(self, batch: Batch) -> float:
        m = self._mask(batch)
        if self.aggregation == "token_mean":
            return float(m.sum())
        n_seq = float((m.sum(1) > 0).sum())
        if self.aggregation == "seq_mean_token_mean":
            return n_seq
        return n_seq * self.norm_length

    def per_token_loss(self, logp: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        old = batch.old_logprobs[:, 1:]
        adv = batch.advantages[:, 1:]
        log_ratio = (logp - old).clamp(-20.0, 20.0)
        ratio = torch.exp(log_ratio)
        unclipped = -adv * ratio
        clipped = -adv * torch.clamp(ratio, 1.0 - self.clip_low, 1.0 + self.clip_high)
        loss = torch.maximum(unclipped, clipped)
        stats = {"ratio": ratio.detach(), "clipped": (clipped > unclipped).float().detach()}
        if self.kl_coef > 0:
            if batch.ref_logprobs is None:
                raise ValueError("kl_coef > 0 needs reference log-probs (rl.kl.reference)")
            delta = (batch.ref_logprobs[:, 1:] - logp).clamp(-20.0, 20.0)
            if self.kl_estimator == "k1":
                kl = -delta
            elif self.kl_estimator == "k2":
                kl = 0.5 * delta**2
            else:
                kl = torch.exp(delta) - delta - 1.0
            loss = loss + self.kl_coef * kl
            stats["kl"] = kl.detach()
        return loss, stats

    def aggregate(self, loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.aggregation == "token_mean":
            return (loss * mask).sum()
        per_seq = (loss * mask).sum(1)
        if self.aggregation == "seq_mean_token_mean":
            return (per_seq / mask.sum(1).clamp_min(1.0)).sum()
        return per_seq.sum()

    def loss_sum(self, model: Any, batch: Batch) -> tuple[torch.Tensor, Metrics]:
        if batch.adapters is not None:  # rows of several LoRA adapters (one per role): each with its own
            return by_adapter(model, batch, self._loss_sum)
        return self._loss_sum(model, batch)

    def _loss_sum(self, model: Any, batch: Batch) -> tuple[torch.Tensor, Metrics]:
        logp, _ = token_logprobs(model, batch, self.temperature)
        mask = self._mask(batch)
        loss, st = self.per_token_loss(logp, batch)
        total = self.aggregate(loss, mask)
        n = float(mask.sum())
        metrics: Metrics = {
            "tokens": n,
            "clip_frac": (float((st["clipped"] * mask).sum()), n),
            "ratio": (float((st["ratio"] * mask).sum()), n),
        }
        if "kl" in st:
            metrics["kl"] = (float((st["kl"] * mask).sum()), n)
        return total, metrics
