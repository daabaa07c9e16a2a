"""BayesLoRA: Monte-Carlo dropout on the LoRA adapter as a cheap estimate of the policy's uncertainty.

A LoRA adapter trained with ``lora_dropout > 0`` is a distribution over adapters: each dropout
mask is one sample. Running ``K`` forward passes with dropout on in the LoRA layers only (the base
model stays in eval mode, so its own dropout, if any, stays off) gives ``K`` predictive
distributions ``p_k`` per token. Per token of the agent's own output:

- **entropy** ``H[p̄]``, with ``p̄ = mean_k p_k``: total predictive uncertainty;
- **expected entropy** ``mean_k H[p_k]``: the part every sample agrees is uncertain (aleatoric);
- **mutual information** ``MI = H[p̄] − mean_k H[p_k] ≥ 0``: how much the samples disagree, the
  epistemic part: high where the adapter's training did not pin the policy down.

With ``lora_dropout = 0`` (or an adapter whose update is zero) every pass is the same and MI is 0.
Scores are computed on the tokens the agent produced (``SOURCE_POLICY``), per assistant turn and
per episode (token-weighted mean).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from trajtune.errors import RenderError, UsageError
from trajtune.tokens import SOURCE_POLICY


def lora_dropout_modules(model: Any) -> list[Any]:
    """The dropout modules of the LoRA layers (PEFT keeps them in ``lora_dropout`` dicts)."""
    out = []
    for mod in model.modules():
        drops = getattr(mod, "lora_dropout", None)
        if drops is not None and hasattr(drops, "values"):
            out.extend(drops.values())
    return out


def lora_dropout_rate(model: Any) -> float:
    """The largest dropout probability among the LoRA layers (0 when they have none)."""
    return max((float(getattr(d, "p", 0.0)) for d in lora_dropout_modules(model)), default=0.0)


def token_uncertainty(model: Any, input_ids: Sequence[int], positions: Sequence[int], k: int,
                      seed: int = 0) -> dict[str, list[float]]:
    """Entropy, expected entropy and MI (nats) of the predictive distribution of each token at
    ``positions`` (indices into ``input_ids``, each ≥ 1: token ``t`` is predicted at ``t - 1``),
    over ``k`` passes with only the LoRA dropout active."""
    import torch

    if k < 2:
        raise UsageError("BayesLoRA needs at least 2 stochastic passes (--bayes-lora K with K >= 2)")
    if any(p < 1 or p >= len(input_ids) for p in positions):
        raise ValueError("positions must lie in 1 .. len(input_ids) - 1")
    drops = lora_dropout_modules(model)
    if not drops:
        raise UsageError("BayesLoRA needs a LoRA adapter (a PEFT adapter directory); this model has no LoRA layers")
    if not positions:
        return {"entropy": [], "expected_entropy": [], "mi": []}
    device = next(model.parameters()).device
    was_training = model.training
    ids = torch.tensor([list(input_ids)], dtype=torch.long, device=device)
    at = torch.tensor([p - 1 for p in positions], dtype=torch.long, device=device)
    cpu_state = torch.random.get_rng_state()
    cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    model.eval()
    for d in drops:
        d.train()
    try:
        torch.manual_seed(seed)
        logps = []
        with torch.no_grad():
            for _ in range(k):
                logits = model(input_ids=ids).logits[0].index_select(0, at)
                logps.append(torch.log_softmax(logits.double(), -1))
    finally:
        model.train(was_training)
        torch.random.set_rng_state(cpu_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)
    total, expected, mi = predictive_entropies(torch.stack(logps))
    return {"entropy": total.tolist(), "expected_entropy": expected.tolist(), "mi": mi.tolist()}


def predictive_entropies(logps: Any) -> tuple[Any, Any, Any]:
    """From log-probabilities ``[K, P, V]`` of K samples: ``H[mean_k p_k]``, ``mean_k H[p_k]`` and
    their difference, the mutual information (per position ``P``). Zero-probability entries count 0."""
    import torch

    k = logps.shape[0]
    mean_lp = torch.logsumexp(logps, 0) - math.log(k)
    total = -torch.special.xlogy(mean_lp.exp(), mean_lp.exp()).sum(-1)
    expected = -torch.special.xlogy(logps.exp(), logps.exp()).sum(-1).mean(0)
    mi = (total - expected).clamp_min(0.0)  # ≥ 0 by Jensen; the clamp only removes float rounding
    return total, expected, mi


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def trajectory_uncertainty(model: Any, renderer: Any, traj: Any, k: int, seed: int = 0) -> dict[str, Any]:
    """Per-turn and per-episode uncertainty over the agent's tokens of one trajectory."""
    tt = renderer.render(traj)
    positions = [i for i, s in enumerate(tt.source) if s == SOURCE_POLICY and i >= 1]
    u = token_uncertainty(model, tt.ids, positions, k, seed)
    turns: dict[int, list[int]] = {}
    for j, p in enumerate(positions):
        turns.setdefault(tt.turn[p], []).append(j)
    per_turn = [{"turn": t, "tokens": len(js), "entropy": _mean([u["entropy"][j] for j in js]),
                 "expected_entropy": _mean([u["expected_entropy"][j] for j in js]),
                 "mi": _mean([u["mi"][j] for j in js])} for t, js in sorted(turns.items())]
    return {"k": k, "policy_tokens": len(positions), "entropy": _mean(u["entropy"]),
            "expected_entropy": _mean(u["expected_entropy"]), "mi": _mean(u["mi"]), "turns": per_turn}


class BayesLoRAScorer:
    """Scores eval episodes as they finish: ``metadata["uncertainty"]`` per episode."""

    def __init__(self, model: Any, renderer: Any, k: int, seed: int = 0):
        if k < 2:
            raise UsageError("--bayes-lora needs at least 2 stochastic passes (e.g. --bayes-lora 8)")
        if not lora_dropout_modules(model):
            raise UsageError("--bayes-lora needs a LoRA adapter: give --model a PEFT adapter directory (a LoRA "
                             "run's checkpoint), not a full model")
        self.dropout = lora_dropout_rate(model)
        if self.dropout == 0:  # every pass would be the same adapter: MI 0 whatever the policy knows
            raise UsageError("--bayes-lora needs an adapter trained with LoRA dropout > 0 (model.lora.dropout, e.g. "
                             "0.1): this adapter's lora_dropout is 0, so every pass is identical and the mutual "
                             "information would be 0")
        self.model, self.renderer, self.k, self.seed = model, renderer, k, seed

    def annotate(self, trajs: Sequence[Any]) -> None:
        for i, t in enumerate(trajs):
            try:
                u = trajectory_uncertainty(self.model, self.renderer, t, self.k, self.seed + i)
            except RenderError as e:  # a template that rewrites history: no single sequence to score
                u = {"k": self.k, "error": str(e)}
            u["lora_dropout"] = self.dropout
            t.metadata["uncertainty"] = u


def summarize_uncertainty(episodes: Sequence[Any]) -> dict[str, Any] | None:
    """``metrics.uncertainty``: means over episodes (each episode's token-weighted means), overall and
    split by outcome, so one can see whether failures were the uncertain ones."""
    scored = [t for t in episodes if isinstance(t.metadata.get("uncertainty"), dict)
              and t.metadata["uncertainty"].get("entropy") is not None]
    if not any("uncertainty" in t.metadata for t in episodes):
        return None

    def agg(ts: list[Any]) -> dict[str, Any]:
        us = [t.metadata["uncertainty"] for t in ts]
        return {"episodes": len(ts), "entropy": _mean([u["entropy"] for u in us]),
                "expected_entropy": _mean([u["expected_entropy"] for u in us]), "mi": _mean([u["mi"] for u in us])}

    first = next(t.metadata["uncertainty"] for t in episodes if "uncertainty" in t.metadata)
    ok = [t for t in scored if t.outcome is not None and t.outcome.success]
    bad = [t for t in scored if not (t.outcome is not None and t.outcome.success)]
    return {"k": first.get("k"), "lora_dropout": first.get("lora_dropout"), **agg(scored),
            "unscored": len(episodes) - len(scored), "success": agg(ok), "failure": agg(bad)}
