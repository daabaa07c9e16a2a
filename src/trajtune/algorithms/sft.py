"""Supervised objectives: one cross-entropy with per-token weights (docs/algorithms.md).

Assistant-only SFT is the renderer's weights as they are (policy tokens, end-of-turn included;
``train_on`` picks all turns, the last one or the per-message hints). EAFT multiplies each
token's cross-entropy by a gradient-free entropy gate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from trajtune.algorithms.batch import Batch


def eaft_weights(logits: torch.Tensor, top_k: int = 20, alpha: float = 1.0) -> torch.Tensor:
    """w_t = (H_t / ln K)^alpha with H_t the entropy of the softmax over the top-K logits; no gradient."""
    with torch.no_grad():
        k = min(top_k, logits.shape[-1])
        top = torch.topk(logits, k, dim=-1).values
        p = torch.softmax(top, dim=-1)
        h = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
        return (h / math.log(k)).clamp(0.0, 1.0) ** alpha


@dataclass
class SFTObjective:
    """Token-mean weighted cross-entropy over trained policy tokens; optional EAFT gate."""

    eaft: bool = False
    eaft_top_k: int = 20
    eaft_alpha: float = 1.0
    name: str = "sft"

    def denominator(self, batch: Batch) -> float:
        return float((batch.loss_mask() * batch.weight[:, 1:]).sum())

    def loss_sum(self, model: Any, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch.loss_mask()
        # Only positions that predict a trained token need logits: with a real vocabulary (49 k for
        # SmolLM2) the LM head and the cross-entropy over all positions are a quarter of the step.
        keep = mask.any(0).nonzero().squeeze(-1)
        if keep.numel() == 0:
            keep = torch.zeros(1, dtype=torch.long)
        logits = selected_logits(model, batch, keep).float()
        targets = batch.input_ids[:, 1:][:, keep]
        m = mask[:, keep]
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        w = m * batch.weight[:, 1:][:, keep]
        if self.eaft:
            w = w * eaft_weights(logits, self.eaft_top_k, self.eaft_alpha)
        loss = (ce * w).sum()
        with torch.no_grad():
            correct = ((logits.argmax(-1) == targets).float() * m).sum()
        return loss, {"ce_sum": float((ce.detach() * m).sum()), "tokens": float(m.sum()), "correct": float(correct)}


def selected_logits(model: Any, batch: Batch, positions: torch.Tensor) -> torch.Tensor:
    """Logits at ``positions`` (hidden-state positions, each predicting the next token), ``[B, K, V]``.

    Asks the model for those positions only (``logits_to_keep``, so the LM head runs on K rows);
    a model that does not take the argument is sliced after a full forward."""
    kwargs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "use_cache": False}
    try:
        logits = model(**kwargs, logits_to_keep=positions).logits
    except TypeError:
        logits = model(**kwargs).logits
    if logits.shape[1] != positions.numel():  # the argument was ignored
        logits = logits[:, positions]
    return logits
