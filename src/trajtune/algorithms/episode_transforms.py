"""Episode transforms of online RL, applied to sampled episodes before (and beside) the advantages:
non-finite rewards, the termination policy, DAPO's overlong penalty, and reference log-probs for
the KL term (docs/algorithms.md).

Why apart from the advantages: these change what an episode *is* (its reward, whether it trains,
what the KL compares with) and are reused outside the group statistics: MC-Critic shapes its
value rollouts with the same termination policy and penalty, DPO scores pairs with the same
reference log-probs.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch

from trajtune.algorithms.batch import collate, token_logprobs
from trajtune.tokens import TokenTrajectory

TerminationPolicy = Literal["keep", "zero_reward", "mask", "drop"]


DEFAULT_TERMINATION_POLICY: dict[str, TerminationPolicy] = {
    "done": "keep",
    "max_turns": "keep",
    "length": "zero_reward",
    "context_overflow": "zero_reward",
    "env_error": "mask",
    "timeout": "mask",
}


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


@torch.no_grad()
def add_ref_logprobs(ref_model: Any, tts: list[TokenTrajectory], pad_id: int, temperature: float = 1.0,
                     batch_size: int = 16) -> None:
    """Store reference-model log-probs in ``meta['ref_logprobs']`` (index t = log p(token t))."""
    for i in range(0, len(tts), batch_size):
        chunk = tts[i:i + batch_size]
        b = collate(chunk, pad_id).to(next(ref_model.parameters()).device)
        logp, _ = token_logprobs(ref_model, b, temperature)
        for r, t in enumerate(chunk):
            t.meta["ref_logprobs"] = [0.0] + logp[r, : len(t) - 1].cpu().tolist()
