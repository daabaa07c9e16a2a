"""GiGPO (Feng et al., 2025, "Group-in-Group Policy Optimization for LLM Agent Training"):
step-level credit from anchor states, without a critic and without extra rollouts
(``rl.credit: gigpo``, docs/algorithms.md).

Why: episode-level GRPO gives every turn of an episode the same advantage, so a good call in an
episode that failed later is pushed down with the rest. The episodes of one task often pass
through the same environment state (every episode starts from the task's prompt; many read the
same thing back after the same first call). Steps taken from one such *anchor state* form a step
group, and comparing their discounted returns says which action was better from that state. The
episode's own advantage stays (the outer group); the step advantage is added with a weight ω:

    A(episode i, turn k) = A^E_i + ω · A^S(s_{i,k}, G_{i,k}),    G_{i,k} = Σ_{j≥k} γ^{j−k} r_{i,j}

where A^S normalises G_{i,k} among all (episode, turn) pairs of the group with the same anchor
state, with the configured estimator (GRPO mean/std, Dr. GRPO mean, RLOO). A state only one step
reached gives A^S = 0, so the estimator falls back to GRPO wherever no state recurs.

The anchor state is found from the token ids, never from the environment's internals: ``history``
(the default) is everything the policy did not write before turn k (prompt, observations,
template), so two steps share a state when the environment has returned the same things so far;
``last`` is only what came back since the previous action (the observation, or the prompt at turn
0), for environments whose observation is the whole state, so that an episode revisiting a state
(a loop) meets its own earlier step there, as the paper's environments do. Neither looks at the
policy's own tokens: two different actions that the environment answers identically lead to the
same anchor state, which is what "the same observation" means.

Why the baseline is not biased toward short or long episodes: each step's baseline is a function
of the state it was taken from (the anchor group's mean return), never of how many turns the
episode went on to take; normalising per turn index and summing over the remaining turns does
depend on that, and biases every "take another turn" decision (tests/test_gigpo.py measures both).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from typing import Literal

from trajtune.algorithms.advantages import Estimator, group_advantages, groups_of, turn_returns
from trajtune.algorithms.episode_transforms import mark_nonfinite_rewards
from trajtune.tokens import SOURCE_POLICY, TokenTrajectory

Anchor = Literal["history", "last"]


def anchor_keys(t: TokenTrajectory, anchor: Anchor = "history") -> dict[int, str]:
    """The anchor state of each policy turn k (turn index → digest of the tokens that define it)."""
    first: dict[int, int] = {}
    last_pos: dict[int, int] = {}
    for i, (s, k) in enumerate(zip(t.source, t.turn)):
        if s == SOURCE_POLICY:
            first.setdefault(k, i)
            last_pos[k] = i
    keys: dict[int, str] = {}
    prev_end = -1
    for k in sorted(first):
        start = 0 if anchor == "history" else prev_end + 1
        ids = [t.ids[i] for i in range(start, first[k]) if t.source[i] != SOURCE_POLICY]
        keys[k] = hashlib.blake2b(repr(ids).encode(), digest_size=12).hexdigest()
        prev_end = last_pos[k]
    return keys


def assign_gigpo_advantages(tts: list[TokenTrajectory], estimator: Estimator = "grpo", gamma: float = 1.0,
                            step_weight: float = 1.0, anchor: Anchor = "history",
                            masked_in_baseline: bool = False) -> tuple[list[TokenTrajectory], dict[str, float]]:
    """Episode advantage plus ω × step advantage within anchor-state groups, on each turn's policy
    tokens. Masked episodes get 0 and, unless ``masked_in_baseline``, stay out of both the episode
    and the step statistics. ``meta['turn_advantages']`` records the per-turn totals and
    ``meta['anchor_group_sizes']`` how many steps shared each turn's state."""
    tts, n_nonfinite = mark_nonfinite_rewards(tts)
    groups = groups_of(tts)
    n_equal = n_step_groups = n_turns = n_anchored = 0
    for members in groups.values():
        base = [t for t in members if masked_in_baseline or not t.meta.get("masked")]
        rewards = [float(t.reward or 0.0) for t in base]
        if not rewards or max(rewards) == min(rewards):
            n_equal += 1
        episode = dict(zip(map(id, base), group_advantages(rewards, estimator)))
        returns = {id(t): turn_returns(t, gamma) for t in members}
        keys = {id(t): anchor_keys(t, anchor) for t in members}
        steps: dict[str, list[tuple[int, int]]] = defaultdict(list)  # state -> [(episode, turn)]
        for t in base:
            for k in keys[id(t)]:
                if k < len(returns[id(t)]):
                    steps[keys[id(t)][k]].append((id(t), k))
        step_adv: dict[tuple[int, int], float] = {}
        size: dict[tuple[int, int], int] = {}
        for pairs in steps.values():
            values = group_advantages([returns[e][k] for e, k in pairs], estimator) if len(pairs) > 1 \
                else [0.0]
            for pair, a in zip(pairs, values):
                step_adv[pair] = a
                size[pair] = len(pairs)
            n_step_groups += len(pairs) > 1
            n_turns += len(pairs)
            n_anchored += len(pairs) if len(pairs) > 1 else 0
        for t in members:
            n = len(returns[id(t)])
            if t.meta.get("masked"):
                per_turn = [0.0] * n
            else:
                a_e = episode.get(id(t), 0.0)
                per_turn = [a_e + step_weight * step_adv.get((id(t), k), 0.0) for k in range(n)]
            t.advantages = [per_turn[k] if s == SOURCE_POLICY and k < n else 0.0 for s, k in zip(t.source, t.turn)]
            t.meta["turn_advantages"] = [round(a, 6) for a in per_turn]
            t.meta["anchor_group_sizes"] = [size.get((id(t), k), 0) for k in range(n)]
    return tts, {"groups": float(len(groups)), "equal_reward_groups": float(n_equal),
                 "nonfinite_rewards": float(n_nonfinite),
                 "masked_episodes": float(sum(1 for t in tts if t.meta.get("masked"))),
                 "gigpo/step_groups": float(n_step_groups),
                 "gigpo/anchored_steps": n_anchored / n_turns if n_turns else 0.0}
