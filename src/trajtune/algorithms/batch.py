"""Collating TokenTrajectories into tensors, and the log-probabilities every objective needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from trajtune.tokens import SOURCE_PAD, SOURCE_POLICY, TokenTrajectory
from trajtune.errors import DataError


@dataclass
class Batch:
    """Right-padded tensors. Position t holds token t; losses use positions 1..T-1 (predicted from t-1)."""

    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long
    source: torch.Tensor  # [B, T] long
    weight: torch.Tensor  # [B, T] float
    old_logprobs: torch.Tensor  # [B, T] float (0 where unknown)
    ref_logprobs: torch.Tensor | None  # [B, T] float
    advantages: torch.Tensor  # [B, T] float (0 where unset)
    rewards: torch.Tensor  # [B] float
    size: int

    def loss_mask(self) -> torch.Tensor:
        """1.0 on trained policy tokens (source policy and weight > 0), shifted to target positions."""
        return ((self.source == SOURCE_POLICY) & (self.weight > 0)).float()[:, 1:]

    def to(self, device: torch.device | str) -> "Batch":
        kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return Batch(**kw)


def collate(tts: list[TokenTrajectory], pad_id: int) -> Batch:
    if not tts:
        raise ValueError("cannot collate an empty batch")
    width = max(len(t) for t in tts)
    b = len(tts)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    src = torch.full((b, width), SOURCE_PAD, dtype=torch.long)
    w = torch.zeros((b, width))
    old = torch.zeros((b, width))
    adv = torch.zeros((b, width))
    has_ref = all("ref_logprobs" in t.meta for t in tts)
    ref = torch.zeros((b, width)) if has_ref else None
    rewards = torch.zeros(b)
    for r, t in enumerate(tts):
        n = len(t)
        ids[r, :n] = torch.tensor(t.ids, dtype=torch.long)
        attn[r, :n] = 1
        src[r, :n] = torch.tensor(t.source, dtype=torch.long)
        w[r, :n] = torch.tensor(t.weight, dtype=torch.float)
        if t.logprobs is not None:
            old[r, :n] = torch.tensor(t.logprobs, dtype=torch.float)
        if t.advantages is not None:
            adv[r, :n] = torch.tensor(t.advantages, dtype=torch.float)
        if ref is not None:
            ref[r, :n] = torch.tensor(t.meta["ref_logprobs"], dtype=torch.float)
        rewards[r] = float(t.reward or 0.0)
    return Batch(ids, attn, src, w, old, ref, adv, rewards, b)


def token_logprobs(model: Any, batch: Batch, temperature: float = 1.0,
                   return_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(token_t | tokens_<t) for t = 1..T-1, shape [B, T-1]."""
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    logits = out.logits[:, :-1, :].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = batch.input_ids[:, 1:]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp, (logits if return_logits else None)


Truncation = Literal["drop", "truncate", "error"]


def fit_length(tts: list[TokenTrajectory], max_length: int, mode: Truncation) -> tuple[list[TokenTrajectory], int]:
    """Apply the configured truncation policy explicitly; returns (kept, number dropped or cut)."""
    kept: list[TokenTrajectory] = []
    affected = 0
    for t in tts:
        if len(t) <= max_length:
            kept.append(t)
            continue
        affected += 1
        if mode == "error":  # the user's choice (data.truncation: error): a data error, not a bug
            raise DataError(
                f"trajectory {t.traj_id!r} has {len(t)} tokens > max_length {max_length}; "
                "raise max_length or set truncation: drop | truncate"
            )
        if mode == "truncate":
            cut = TokenTrajectory(
                ids=t.ids[:max_length], source=t.source[:max_length], turn=t.turn[:max_length],
                weight=t.weight[:max_length],
                logprobs=t.logprobs[:max_length] if t.logprobs is not None else None,
                advantages=t.advantages[:max_length] if t.advantages is not None else None,
                traj_id=t.traj_id, group=t.group, reward=t.reward, success=t.success,
                termination="length", meta=dict(t.meta, truncated_from=len(t)),
            )
            kept.append(cut)
    return kept, affected
