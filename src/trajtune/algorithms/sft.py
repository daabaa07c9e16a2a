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
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        logits = out.logits[:, :-1, :].float()
        targets = batch.input_ids[:, 1:]
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        w = batch.loss_mask() * batch.weight[:, 1:]
        if self.eaft:
            w = w * eaft_weights(logits, self.eaft_top_k, self.eaft_alpha)
        loss = (ce * w).sum()
        with torch.no_grad():
            m = batch.loss_mask()
            correct = ((logits.argmax(-1) == targets).float() * m).sum()
        return loss, {"ce_sum": float((ce.detach() * m).sum()), "tokens": float(m.sum()), "correct": float(correct)}
