"""PPO with a learned value head and token-level GAE (``rl.credit: gae``), and the learned value
MC-Critic can blend in (``rl.mc_critic.value_weight``).

Why a value head: group-relative baselines need G episodes of the same task and compare whole
episodes; a learned value V(s) gives every policy token its own baseline from one episode, and
GAE(γ, λ) trades the bias of bootstrapping from V against the variance of the Monte-Carlo return.

The head is one linear layer on the policy's last hidden state (shared trunk, trained jointly;
zero-initialised, so it predicts 0 and sends no gradient into the trunk until its weights move).
``values[t]`` is its prediction from the hidden state at t − 1: the value of the state *before*
token t, aligned like ``log p(token t)``. Only policy tokens are steps of the MDP: observation and
prompt tokens (m_t = 0) get no advantage and no value loss.

Token-level GAE over an episode's policy tokens i = 1..N (turn k(i)):

    r_i  = r_k at the last policy token of turn k (``turn_rewards``), 0 elsewhere
    γ_i  = γ where token i + 1 starts the next turn, 1 inside a turn (γ discounts turns, as in
           ``rl.credit: turn``)
    δ_i  = r_i + γ_i · V_{i+1} − V_i             (V after the last policy token = 0)
    A_i  = δ_i + γ_i · λ · A_{i+1}
    R_i  = A_i + V_i                             (the value head's target)

λ = 1 gives A_i = G_{k(i)} − V_i (the discounted turn return minus the value), λ = 0 the TD
error δ_i. With ``whiten_advantages`` the advantages are whitened over the batch's trained
policy tokens (the returns are not).

The objective is the clipped surrogate plus ``vf_coef`` · ½ max((V − R)², (V_clip − R)²), with
V_clip = V_old + clip(V − V_old, ±clip) (PPO value clipping; plain ½ (V − R)² without ``clip``),
aggregated like the policy loss over the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from pydantic import Field

from trajtune.algorithms.base import Metrics
from trajtune.algorithms.advantages import turn_returns, turn_rewards
from trajtune.algorithms.batch import Batch, collate, kept_head_input
from trajtune.algorithms.episode_transforms import mark_nonfinite_rewards
from trajtune.algorithms.lm_head import head_logprobs
from trajtune.algorithms.policy_gradient import PolicyGradientObjective
from trajtune.config import _C
from trajtune.tokens import SOURCE_POLICY, TokenTrajectory

#: the file the value head is saved to, in checkpoints and next to the final model
VALUE_HEAD_FILE = "value_head.safetensors"


class ValueSpec(_C):
    vf_coef: float = Field(0.1, gt=0, description="weight of the value loss added to the policy loss")
    clip: float | None = Field(0.2, gt=0, description="PPO value clipping: the new value may move at most this far "
                                                      "from the value at sampling time in the loss (null: no "
                                                      "clipping)")
    lam: float = Field(1.0, ge=0, le=1, description="λ of token-level GAE (credit: gae; 1: A = return − V, 0: the "
                                                    "TD error)")
    whiten_advantages: bool = Field(True, description="whiten the GAE advantages over the batch's trained policy "
                                                      "tokens (credit: gae)")


class ValueHead(torch.nn.Module):
    """V(s) = w · h + b on the last hidden state; float32 whatever the model's dtype."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.linear.weight)  # deterministic (no RNG draw), and V = 0 at the start
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden.float()).squeeze(-1)


def hidden_size(model: Any) -> int:
    return int(model.get_input_embeddings().weight.shape[1])


def logprobs_and_values(model: Any, head: ValueHead, batch: Batch,
                        temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward: log π(token_t) (like ``token_logprobs``, computed only where some row has a
    policy token, through the LM head in chunks) and the value of the state before token t, both
    ``[B, T − 1]`` for t = 1..T−1."""
    keep = (batch.source[:, 1:] == SOURCE_POLICY).any(0).nonzero().squeeze(-1)
    if keep.numel() == 0:
        keep = torch.zeros(1, dtype=torch.long, device=batch.input_ids.device)
    inp = kept_head_input(model, batch, keep, output_hidden_states=True)
    targets = batch.input_ids[:, 1:][:, keep]
    picked = head_logprobs(inp, targets.unsqueeze(-1), temperature)[0].squeeze(-1)
    logp = picked.new_zeros(batch.input_ids.shape[0], batch.input_ids.shape[1] - 1).index_copy(1, keep, picked)
    values = head(inp.out.hidden_states[-1][:, :-1])
    return logp, values


@torch.no_grad()
def add_values(model: Any, head: ValueHead, tts: list[TokenTrajectory], pad_id: int,
               batch_size: int = 16) -> None:
    """Store the head's values in ``meta['values']`` (index t: the state before token t; index 0
    holds 0), the V_old of GAE and of value clipping."""
    device = next(head.parameters()).device
    for i in range(0, len(tts), batch_size):
        chunk = tts[i:i + batch_size]
        _, v = logprobs_and_values(model, head, collate(chunk, pad_id).to(device))
        for r, t in enumerate(chunk):
            t.meta["values"] = [0.0] + v[r, : len(t) - 1].cpu().tolist()


def token_gae(t: TokenTrajectory, gamma: float, lam: float) -> tuple[list[float], list[float]]:
    """(advantages, returns) per token of ``t`` from ``meta['values']`` (0 off the policy tokens)."""
    n = len(t)
    values = list(t.meta.get("values", []))[:n]
    values += [0.0] * (n - len(values))
    pos = [i for i, s in enumerate(t.source) if s == SOURCE_POLICY]
    rewards = turn_rewards(t)
    last_of_turn = {t.turn[i]: i for i in pos}  # turn -> its last policy token
    adv, ret = [0.0] * n, [0.0] * n
    acc, next_v = 0.0, 0.0
    for j in range(len(pos) - 1, -1, -1):
        i = pos[j]
        k = t.turn[i]
        r = rewards[k] if last_of_turn[k] == i and k < len(rewards) else 0.0
        g = gamma if j + 1 < len(pos) and t.turn[pos[j + 1]] != k else 1.0
        acc = r + g * next_v - values[i] + g * lam * acc
        adv[i], ret[i] = acc, acc + values[i]
        next_v = values[i]
    return adv, ret


def assign_gae_advantages(tts: list[TokenTrajectory], gamma: float = 1.0, lam: float = 1.0,
                          whiten_advantages: bool = False) -> tuple[list[TokenTrajectory], dict[str, float]]:
    """Token-level GAE (``token_gae``) on every episode: ``advantages`` and ``meta['returns']``;
    masked episodes get 0 (their weight is 0 too, so they carry no value loss either)."""
    tts, n_nonfinite = mark_nonfinite_rewards(tts)
    for t in tts:
        if t.meta.get("masked"):
            t.advantages, t.meta["returns"] = [0.0] * len(t), [0.0] * len(t)
            continue
        t.advantages, t.meta["returns"] = token_gae(t, gamma, lam)
    trained = [(t, i) for t in tts if not t.meta.get("masked")
               for i, (s, w) in enumerate(zip(t.source, t.weight)) if s == SOURCE_POLICY and w > 0]
    if whiten_advantages and len(trained) > 1:
        a = torch.tensor([t.advantages[i] for t, i in trained], dtype=torch.float64)  # type: ignore[index]
        white = ((a - a.mean()) / (a.std(unbiased=True) + 1e-8)).tolist()
        for (t, i), x in zip(trained, white):
            t.advantages[i] = x  # type: ignore[index]
    for t in tts:
        t.meta["turn_advantages"] = [round(next((a for a, s, k in zip(t.advantages or [], t.source, t.turn)
                                                 if s == SOURCE_POLICY and k == turn), 0.0), 6)
                                     for turn in range(len(turn_rewards(t)))]
    vals = [t.meta["values"][i] for t, i in trained if "values" in t.meta]
    return tts, {"nonfinite_rewards": float(n_nonfinite),
                 "masked_episodes": float(sum(1 for t in tts if t.meta.get("masked"))),
                 "value_old_mean": sum(vals) / len(vals) if vals else 0.0}


def turn_start_values(t: TokenTrajectory) -> list[float]:
    """The head's V(s_k): ``meta['values']`` at the first policy token of each turn."""
    values = t.meta.get("values", [])
    first: dict[int, float] = {}
    for i, (s, k) in enumerate(zip(t.source, t.turn)):
        if s == SOURCE_POLICY and k not in first:
            first[k] = float(values[i]) if i < len(values) else 0.0
    return [first.get(k, 0.0) for k in range(len(turn_rewards(t)))]


def set_turn_return_targets(t: TokenTrajectory, gamma: float) -> None:
    """``meta['returns']``: the discounted turn return G_k on turn k's policy tokens (the value
    head's target under MC-Critic blending: the episode's own Monte-Carlo return)."""
    g = turn_returns(t, gamma)
    t.meta["returns"] = [g[k] if s == SOURCE_POLICY and k < len(g) else 0.0 for s, k in zip(t.source, t.turn)]


@dataclass
class ValueEstimator:
    """Episode hook (``RolloutSource.critic``): V_old for every token of the step's episodes."""

    head: ValueHead
    pad_id: int

    def __call__(self, step: int, episodes: list[Any], model: Any) -> dict[str, float]:
        if episodes:
            add_values(model, self.head, [e.tokens for e in episodes], self.pad_id)
        return {}


def chain_critics(*critics: Any) -> Any:
    """Run episode hooks in order and merge their metrics."""

    def run(step: int, episodes: list[Any], model: Any) -> dict[str, float]:
        out: dict[str, float] = {}
        for c in critics:
            out.update(c(step, episodes, model))
        return out

    return run


def value_loss(values: torch.Tensor, old: torch.Tensor, returns: torch.Tensor,
               clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ½ (V − R)², or with ``clip`` the PPO clipped form; and where the clipped term won."""
    unclipped = (values - returns) ** 2
    if clip is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped)
    v_clip = old + (values - old).clamp(-clip, clip)
    clipped = (v_clip - returns) ** 2
    return 0.5 * torch.maximum(unclipped, clipped), (clipped > unclipped).float()


@dataclass
class ValueObjective(PolicyGradientObjective):
    """The clipped surrogate plus ``vf_coef`` × the value loss, from one forward. ``module`` is
    the value head: the learner trains it with the policy, checkpoints it and restores it."""

    head: ValueHead | None = None
    vf_coef: float = 0.1
    value_clip: float | None = 0.2
    name: str = "ppo_value"
    module_file: str = VALUE_HEAD_FILE

    @property
    def module(self) -> ValueHead:
        assert self.head is not None
        return self.head

    def loss_sum(self, model: Any, batch: Batch) -> tuple[torch.Tensor, Metrics]:
        if batch.values is None or batch.returns is None:
            raise ValueError("the value objective needs meta['values'] and meta['returns'] on every trajectory")
        logp, values = logprobs_and_values(model, self.module, batch, self.temperature)
        mask = self._mask(batch)
        loss, st = self.per_token_loss(logp, batch)
        vl, vclipped = value_loss(values, batch.values[:, 1:], batch.returns[:, 1:], self.value_clip)
        total = self.aggregate(loss + self.vf_coef * vl, mask)
        n = float(mask.sum())
        metrics: Metrics = {
            "tokens": n,
            "clip_frac": (float((st["clipped"] * mask).sum()), n),
            "ratio": (float((st["ratio"] * mask).sum()), n),
            "value_loss": (float((vl.detach() * mask).sum()), n),
            "value_mean": (float((values.detach() * mask).sum()), n),
            "value_clip_frac": (float((vclipped * mask).sum()), n),
        }
        if "kl" in st:
            metrics["kl"] = (float((st["kl"] * mask).sum()), n)
        return total, metrics
