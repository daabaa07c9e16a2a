"""Stand-in models for checking objective arithmetic exactly."""

from __future__ import annotations

import torch


class FixedLogits(torch.nn.Module):
    """A 'model' returning given logits (a trainable parameter), whatever the input."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = torch.nn.Parameter(logits)

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        return type("O", (), {"logits": self.logits})()
