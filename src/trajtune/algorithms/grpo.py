"""Online RL pieces: group advantages (GRPO, Dr. GRPO, RLOO, REINFORCE++), DAPO switches, and the
clipped policy-gradient objective with optional KL to a reference (docs/algorithms.md).

Observation and prompt tokens never carry loss: the mask is source == policy, so multi-turn
trajectories train only on what the policy sampled.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Literal

import torch

from trajtune.algorithms.base import Metrics
from trajtune.algorithms.batch import Batch, token_logprobs
from trajtune.tokens import SOURCE_POLICY, TokenTrajectory

Estimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"]
Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
TerminationPolicy = Literal["keep", "zero_reward", "mask", "drop"]

DEFAULT_TERMINATION_POLICY: dict[str, TerminationPolicy] = {
    "done": "keep",
    "max_turns": "keep",
    "length": "zero_reward",
    "context_overflow": "zero_reward",
    "env_error": "mask",
    "timeout": "mask",
}


def group_advantages(rewards: list[float], estimator: Estimator = "grpo", eps: float = 1e-6) -> list[float]:
    """Per-trajectory advantages within one group of G samples of the same task."""
    r = torch.tensor(rewards, dtype=torch.float64)
    g = len(rewards)
    if g == 0:
        return []
    mean = r.mean()
    if estimator == "grpo":
        std = r.std(unbiased=True) if g > 1 else torch.tensor(0.0, dtype=torch.float64)
        a = (r - mean) / (std + eps)
    elif estimator in ("dr_grpo", "reinforce_pp_baseline"):
        a = r - mean
    elif estimator == "rloo":
        a = (r - mean) * (g / (g - 1)) if g > 1 else torch.zeros_like(r)
    elif estimator == "reinforce_pp":
        a = r.clone()
    else:
        raise ValueError(f"unknown advantage estimator {estimator!r}")
    return [float(x) for x in a]


def whiten(values: list[float], eps: float = 1e-8) -> list[float]:
    v = torch.tensor(values, dtype=torch.float64)
    if len(values) < 2:
        return [0.0 for _ in values]
    return [float(x) for x in (v - v.mean()) / (v.std(unbiased=True) + eps)]


def overlong_penalty(length: int, max_length: int, cache: int) -> float:
    """DAPO soft overlong punishment: 0 up to L-C, linear to -1 at L, -1 beyond."""
    if length <= max_length - cache:
        return 0.0
    if length <= max_length:
        return ((max_length - cache) - length) / cache
    return -1.0


def mark_nonfinite_rewards(tts: list[TokenTrajectory]) -> tuple[list[TokenTrajectory], int]:
    """A non-finite reward (inf or NaN, e.g. from a buggy reward function) says nothing about the
    policy: the episode becomes ``env_error`` with zero weight and no reward, whatever the
    termination policy says, so its group's mean and std stay finite."""
    n = 0
    for t in tts:
        if not math.isfinite(float(t.reward or 0.0)):
            n += 1
            t.meta["nonfinite_reward"] = float(t.reward)  # type: ignore[arg-type]
            t.reward = 0.0
            t.termination = "env_error"
            t.weight = [0.0] * len(t.weight)
            t.meta["masked"] = True
    return tts, n


def apply_termination_policy(tts: list[TokenTrajectory],
                             policy: dict[str, TerminationPolicy] | None = None) -> list[TokenTrajectory]:
    """Make what happens to truncated / failed episodes explicit (Contract 4). A masked episode gets
    zero weight and ``meta['masked']``, which keeps it out of its group's baseline (see
    ``assign_advantages``)."""
    pol = dict(DEFAULT_TERMINATION_POLICY, **(policy or {}))
    out = []
    for t in tts:
        action = pol.get(t.termination or "done", "keep")
        if action == "drop":
            continue
        if action == "zero_reward":
            t.reward = 0.0
        elif action == "mask":
            t.weight = [0.0] * len(t.weight)
            t.meta["masked"] = True
        out.append(t)
    return out


def apply_overlong_penalty(tts: list[TokenTrajectory], max_length: int, cache: int) -> float:
    """Add DAPO's soft overlong penalty to each reward, |y| = the episode's policy tokens. Returns the
    mean penalty (a metric)."""
    total = 0.0
    for t in tts:
        p = overlong_penalty(t.n_policy(), max_length, cache)
        t.reward = float(t.reward or 0.0) + p
        total += p
    return total / max(1, len(tts))


Whitening = Literal["token", "trajectory"]


def whiten_advantages(values: list[float], counts: list[int], mode: Whitening = "token",
                      eps: float = 1e-8) -> list[float]:
    """Batch whitening for REINFORCE++. ``token``: statistics over policy tokens (each trajectory's
    value counted once per policy token, unbiased std, as verl's masked whitening), so a long
    trajectory weighs more; ``trajectory``: one value per trajectory."""
    if mode == "trajectory":
        return whiten(values, eps)
    v = torch.tensor(values, dtype=torch.float64)
    c = torch.tensor(counts, dtype=torch.float64)
    n = float(c.sum())
    if n < 2:
        return [0.0 for _ in values]
    mean = float((v * c).sum()) / n
    var = float((c * (v - mean) ** 2).sum()) / (n - 1)
    return [float((x - mean) / (math.sqrt(var) + eps)) for x in values]


def is_informative(members: list[TokenTrajectory]) -> bool:
    """A group teaches something only when its unmasked members' rewards differ (DAPO)."""
    r = [float(t.reward or 0.0) for t in members if not t.meta.get("masked")]
    return len(r) >= 2 and max(r) != min(r)


def groups_of(tts: list[TokenTrajectory]) -> dict[str, list[TokenTrajectory]]:
    groups: dict[str, list[TokenTrajectory]] = defaultdict(list)
    for t in tts:
        groups[t.group or t.traj_id].append(t)
    return groups


def assign_advantages(tts: list[TokenTrajectory], estimator: Estimator = "grpo",
                      drop_equal_groups: bool = False, whitening: Whitening = "token",
                      masked_in_baseline: bool = False) -> tuple[list[TokenTrajectory], dict[str, float]]:
    """Group by ``group`` (the task), compute advantages, broadcast them to policy tokens.

    Masked episodes (``meta['masked']``: env errors, timeouts, non-finite rewards) get advantage 0
    and, unless ``masked_in_baseline``, stay out of the baseline: an environment failure says
    nothing about the policy, and counting it as reward 0 would raise its siblings' advantages.
    A non-finite reward left unmarked is marked here (see ``mark_nonfinite_rewards``)."""
    tts, n_nonfinite = mark_nonfinite_rewards(tts)
    groups = groups_of(tts)
    kept: list[TokenTrajectory] = []
    n_equal = 0
    scalar: dict[int, float] = {}
    for members in groups.values():
        base = [t for t in members if masked_in_baseline or not t.meta.get("masked")]
        rewards = [float(t.reward or 0.0) for t in base]
        if not rewards or max(rewards) == min(rewards):
            n_equal += 1
            if drop_equal_groups:
                continue
        adv = dict(zip(map(id, base), group_advantages(rewards, estimator)))
        for t in members:
            scalar[id(t)] = 0.0 if t.meta.get("masked") else adv.get(id(t), 0.0)
            kept.append(t)
    if estimator in ("reinforce_pp", "reinforce_pp_baseline"):
        live = [t for t in kept if not t.meta.get("masked")]
        white = whiten_advantages([scalar[id(t)] for t in live], [t.n_policy() for t in live], whitening)
        for t, a in zip(live, white):
            scalar[id(t)] = a
    for t in kept:
        a = scalar[id(t)]
        t.advantages = [a if s == SOURCE_POLICY else 0.0 for s in t.source]
    return kept, {"groups": float(len(groups)), "equal_reward_groups": float(n_equal),
                  "nonfinite_rewards": float(n_nonfinite),
                  "masked_episodes": float(sum(1 for t in tts if t.meta.get("masked")))}


def turn_rewards(t: TokenTrajectory) -> list[float]:
    """r_k of each policy turn (``meta['turn_rewards']``), with the changes made to the episode's
    reward after the rollout (termination policy, overlong penalty) on the last turn, the one that
    ended the episode, so they sum to the episode reward."""
    n = max((k for k, s in zip(t.turn, t.source) if s == SOURCE_POLICY), default=-1) + 1
    r = [float(x) for x in t.meta.get("turn_rewards", [])][:n]
    r += [0.0] * (n - len(r))
    if r:
        r[-1] += float(t.reward or 0.0) - sum(r)
    return r


def discounted_returns(rewards: list[float], gamma: float) -> list[float]:
    """G_k = Σ_{j≥k} γ^{j−k} r_j for every k."""
    out = [0.0] * len(rewards)
    acc = 0.0
    for k in range(len(rewards) - 1, -1, -1):
        acc = rewards[k] + gamma * acc
        out[k] = acc
    return out


def turn_returns(t: TokenTrajectory, gamma: float) -> list[float]:
    """The discounted returns of the episode's turns (``turn_rewards``): with γ = 1, G_0 is the
    episode reward."""
    return discounted_returns(turn_rewards(t), gamma)


def assign_turn_advantages(tts: list[TokenTrajectory], estimator: Estimator = "grpo", gamma: float = 1.0,
                           masked_in_baseline: bool = False) -> tuple[list[TokenTrajectory], dict[str, float]]:
    """Turn-level credit: each turn's return G_k is compared with the returns of the group's other
    episodes at the same depth k (the same estimator as episode-level: GRPO mean/std, Dr. GRPO
    mean, RLOO leave-one-out), and the result goes to that turn's policy tokens. A depth only one
    episode reached gets 0. Masked episodes get 0 and, unless ``masked_in_baseline``, stay out of
    the statistics."""
    tts, n_nonfinite = mark_nonfinite_rewards(tts)
    groups = groups_of(tts)
    n_equal = 0
    for members in groups.values():
        returns = {id(t): turn_returns(t, gamma) for t in members}
        base = [t for t in members if masked_in_baseline or not t.meta.get("masked")]
        rewards = [float(t.reward or 0.0) for t in base]
        if not rewards or max(rewards) == min(rewards):
            n_equal += 1
        depth = max((len(v) for v in returns.values()), default=0)
        adv: dict[int, list[float]] = {id(t): [0.0] * len(returns[id(t)]) for t in members}
        for k in range(depth):
            at_k = [t for t in base if len(returns[id(t)]) > k]
            for t, a in zip(at_k, group_advantages([returns[id(t)][k] for t in at_k], estimator)):
                adv[id(t)][k] = a
        for t in members:
            a_t = adv[id(t)]
            t.advantages = [0.0 if t.meta.get("masked") or s != SOURCE_POLICY or k >= len(a_t) else a_t[k]
                            for s, k in zip(t.source, t.turn)]
            t.meta["turn_advantages"] = [0.0 if t.meta.get("masked") else round(a, 6) for a in a_t]
    return tts, {"groups": float(len(groups)), "equal_reward_groups": float(n_equal),
                 "nonfinite_rewards": float(n_nonfinite),
                 "masked_episodes": float(sum(1 for t in tts if t.meta.get("masked")))}


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


@torch.no_grad()
def add_ref_logprobs(ref_model: Any, tts: list[TokenTrajectory], pad_id: int, temperature: float = 1.0,
                     batch_size: int = 16) -> None:
    """Store reference-model log-probs in ``meta['ref_logprobs']`` (index t = log p(token t))."""
    from trajtune.algorithms.batch import collate

    for i in range(0, len(tts), batch_size):
        chunk = tts[i:i + batch_size]
        b = collate(chunk, pad_id).to(next(ref_model.parameters()).device)
        logp, _ = token_logprobs(ref_model, b, temperature)
        for r, t in enumerate(chunk):
            t.meta["ref_logprobs"] = [0.0] + logp[r, : len(t) - 1].cpu().tolist()
