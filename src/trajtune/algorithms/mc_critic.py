"""MC-Critic (ProAct) and turn-level GAE (``rl.credit: mc_critic``).

Why: group-relative advantages compare whole episodes; they cannot tell that turn 2 put an
episode in a good spot and turn 3 threw it away. A critic can, but a learned value head needs its
own training and is wrong early on. MC-Critic estimates the value of the state before each turn
directly: V(s_k) = the mean discounted return of M fresh rollouts of the current policy from that
state. The state is reached by replaying the episode's earlier actions through the environment
(``Environment.reach``) when the environment is deterministic, else by restoring the snapshot the
episode took before that turn (``Environment.snapshot`` / ``restore``; the episodes are then
sampled with ``RolloutConfig.snapshots``). Then, per turn,

    δ_k = r_k + γ · V(s_{k+1}) − V(s_k)      (V after the last turn = 0)
    A_k = Σ_l (γλ)^l · δ_{k+l}

and turn k's advantage goes to its policy tokens (λ = 1 gives A_k = G_k − V(s_k)). r_k are the
episode's turn rewards as trained (``turn_rewards``: after reward composition, the termination
policy and the overlong penalty), and the Monte-Carlo rollouts' rewards go through the same
shaping (``shape``), so V estimates the same quantity; a rollout the termination policy masks
(an environment error) does not count in the mean. A rollout from s_k gets the turns the episode
had left (``rollout.max_turns − k``). Cost: M rollouts per turn of every episode.

Blending (``value_weight`` w > 0): V(s_k) = (1 − w) · V_MC(s_k) + w · V_learned(s_k), where
V_learned is a value head on the policy (``algorithms.value``) read at turn k's first policy
token; the head is trained jointly on the episodes' own discounted turn returns G_k. w = 0 is pure
MC-Critic; w = 1 uses only the learned value (the rollouts are then still sampled and logged).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import Field

from trajtune import rollout as agent_loop  # by module: tests replace agent_loop.run_rollouts
from trajtune.algorithms.advantages import discounted_returns, groups_of, turn_rewards
from trajtune.algorithms.episode_transforms import mark_nonfinite_rewards
from trajtune.algorithms.value import set_turn_return_targets, turn_start_values
from trajtune.config import _C
from trajtune.rollout import StartState
from trajtune.tokens import SOURCE_POLICY, TokenTrajectory


class MCCriticSpec(_C):
    samples: int = Field(4, gt=0, description="M: rollouts from each state whose mean return is its value")
    lam: float = Field(1.0, ge=0, le=1, description="λ of turn-level GAE (1: A_k = G_k − V(s_k))")
    value_weight: float = Field(0.0, ge=0, le=1, description="w: V(s_k) = (1 − w) · V_MC + w · V_learned, the "
                                                             "value head's prediction at the turn's start (w > 0 "
                                                             "trains a value head, configured by rl.value)")


def discounted(rewards: list[float], gamma: float) -> float:
    """Σ_j γ^j r_j: the return from the first turn."""
    return discounted_returns(rewards, gamma)[0] if rewards else 0.0


def gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """A_k = Σ_l (γλ)^l δ_{k+l}, δ_k = r_k + γ V_{k+1} − V_k, V after the last turn 0."""
    n = len(rewards)
    out = [0.0] * n
    acc = 0.0
    for k in range(n - 1, -1, -1):
        nxt = values[k + 1] if k + 1 < n else 0.0
        acc = rewards[k] + gamma * nxt - values[k] + gamma * lam * acc
        out[k] = acc
    return out


def state_prefixes(messages: list[Any], n_turns: int) -> list[list[Any]]:
    """The conversation before each of the first ``n_turns`` assistant turns."""
    where = [i for i, m in enumerate(messages) if m.role == "assistant"][:n_turns]
    return [list(messages[:i]) for i in where]


class MCCritic:
    """Episode hook: stores V(s_k) for every turn of every episode in ``meta['mc_values']``."""

    def __init__(self, spec: MCCriticSpec, gamma: float, env_factory: Any, rollout: Any, tokenizer: Any,
                 renderer: Any, seed: int = 0, shape: Any = None, snapshots: bool = False):
        self.spec, self.gamma, self.shape = spec, gamma, shape  # shape(step, episodes): the training reward
        self.snapshots = snapshots  # reach states by restoring the episodes' snapshots, not by replay
        self.env_factory, self.rollout, self.tokenizer, self.renderer, self.seed = (
            env_factory, rollout, tokenizer, renderer, seed)

    def __call__(self, step: int, episodes: list[Any], model: Any) -> dict[str, float]:
        m = self.spec.samples
        jobs: dict[int, list[tuple[int, Any, list[Any]]]] = {}  # depth -> (episode, task, prefix)
        counts = []
        for i, e in enumerate(episodes):
            n = len(turn_rewards(e.tokens))
            prefixes: list[Any] = state_prefixes(e.trajectory.messages, n)
            if self.snapshots:
                if len(e.snapshots) < len(prefixes):
                    raise RuntimeError(f"episode {e.trajectory.id}: {len(e.snapshots)} snapshots for {len(prefixes)} "
                                       "turns (sample with RolloutConfig.snapshots)")
                prefixes = [StartState(e.snapshots[k][0], p, e.snapshots[k][1]) for k, p in enumerate(prefixes)]
            counts.append(len(prefixes))
            for k, p in enumerate(prefixes):
                jobs.setdefault(k, []).append((i, e.task, p))
        values: list[list[float]] = [[0.0] * c for c in counts]
        n_rollouts = 0
        for k, items in sorted(jobs.items()):
            cfg = replace(self.rollout, max_turns=max(1, self.rollout.max_turns - k))
            tasks = [t for _, t, _ in items for _ in range(m)]
            prefixes = [p for _, _, p in items for _ in range(m)]
            got = agent_loop.run_rollouts(model, self.tokenizer, self.env_factory, tasks, cfg,
                                          seed=self.seed * 1_000_003 + step * 7_919 + 104_723 * (k + 1),
                                          renderer=self.renderer, prefixes=prefixes)
            n_rollouts += len(got)
            if self.shape is not None:
                self.shape(step, got)
            for j, (i, _, _) in enumerate(items):
                rets = [discounted(turn_rewards(g.tokens), self.gamma)
                        for g in got[j * m:(j + 1) * m] if not g.tokens.meta.get("masked")]
                values[i][k] = sum(rets) / len(rets) if rets else 0.0
        for e, v in zip(episodes, values):
            e.tokens.meta["mc_values"] = v
            e.trajectory.metadata["mc_values"] = [round(x, 6) for x in v]
        flat = [x for v in values for x in v]
        return {"mc_rollouts": float(n_rollouts), "mc_value_mean": sum(flat) / len(flat) if flat else 0.0}


def assign_mc_advantages(tts: list[TokenTrajectory], gamma: float = 1.0, lam: float = 1.0,
                         value_weight: float = 0.0) -> tuple[list[TokenTrajectory], dict[str, float]]:
    """Turn-level GAE with the Monte-Carlo values (``meta['mc_values']``) on each turn's policy tokens;
    masked episodes get 0. With ``value_weight`` w > 0 the values are blended with the value head's
    (``meta['values']`` at each turn's first policy token), and ``meta['returns']`` gets the head's
    targets."""
    tts, n_nonfinite = mark_nonfinite_rewards(tts)
    for t in tts:
        r = turn_rewards(t)
        v = list(t.meta.get("mc_values", []))[:len(r)]
        v += [0.0] * (len(r) - len(v))
        if value_weight > 0:
            learned = turn_start_values(t)
            v = [(1.0 - value_weight) * mc + value_weight * lv for mc, lv in zip(v, learned)]
            t.meta["blended_values"] = [round(x, 6) for x in v]
            set_turn_return_targets(t, gamma)
        a = [0.0] * len(r) if t.meta.get("masked") else gae(r, v, gamma, lam)
        t.meta["turn_advantages"] = [round(x, 6) for x in a]
        t.advantages = [a[k] if s == SOURCE_POLICY and k < len(a) else 0.0 for s, k in zip(t.source, t.turn)]
    return tts, {"groups": float(len(groups_of(tts))), "nonfinite_rewards": float(n_nonfinite),
                 "masked_episodes": float(sum(1 for t in tts if t.meta.get("masked")))}
