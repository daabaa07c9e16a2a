"""Advantages of online RL: the group estimators (GRPO, Dr. GRPO, RLOO, REINFORCE++), batch
whitening, DAPO's informative-group test, and turn-level credit from per-turn returns
(docs/algorithms.md).

Observation and prompt tokens never carry an advantage: only tokens whose source is policy get
one, so multi-turn trajectories train only on what the policy sampled.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Literal

import torch

from trajtune.algorithms.episode_transforms import mark_nonfinite_rewards
from trajtune.tokens import CLOSED_ROWS, SOURCE_POLICY, TokenTrajectory

Estimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"]


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
        t.meta["episode_advantage"] = a
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


def with_closed_rows(tts: list[TokenTrajectory]) -> tuple[list[TokenTrajectory], dict[str, float]]:
    """Each episode's closed rows (``CLOSED_ROWS``: folded branches, contexts before observation
    masking) join the batch right after it, in its group, with its episode-level advantage on their
    trained tokens. After the advantages: a closed row is part of its episode, not another sample
    of the group, so it must not count in the baseline."""
    out: list[TokenTrajectory] = []
    n = 0
    for t in tts:
        out.append(t)
        rows = t.meta.pop(CLOSED_ROWS, None) or []
        if rows and "episode_advantage" not in t.meta:
            raise ValueError("closed rows (context folding, observation masking) train with episode-level "
                             "advantages only; set rl.credit: episode")
        for r in rows:
            a = float(t.meta["episode_advantage"])
            r.group = t.group
            r.advantages = [a if s == SOURCE_POLICY and w > 0 else 0.0 for s, w in zip(r.source, r.weight)]
            r.meta = {**r.meta, "masked": t.meta.get("masked", False), "episode_advantage": a}
            out.append(r)
            n += 1
    return out, ({"closed_rows": float(n)} if n else {})
