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
    values: torch.Tensor | None = None  # [B, T] float: V_old of the state before token t (a value head's runs)
    returns: torch.Tensor | None = None  # [B, T] float: the value head's targets
    #: per row, the LoRA adapter its loss trains (``meta["adapter"]``; DualTune), None when no row names one
    adapters: list[str] | None = None

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
    value_keys = [k for k in ("values", "returns") if all(k in t.meta for t in tts)]
    extra = {k: torch.zeros((b, width)) for k in value_keys}
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
        for k, v in extra.items():
            v[r, :n] = torch.tensor(t.meta[k][:n], dtype=torch.float)
    adapters = [t.meta.get("adapter", "default") for t in tts] if any("adapter" in t.meta for t in tts) else None
    return Batch(ids, attn, src, w, old, ref, adv, rewards, b, **extra, adapters=adapters)


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


def token_logprobs(model: Any, batch: Batch, temperature: float = 1.0,
                   return_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(token_t | tokens_<t) for t = 1..T-1, shape [B, T-1], at every position that predicts a
    policy token in some row; other positions hold 0 (no objective reads them: their mask is 0).

    Why only there: with a real vocabulary the LM head and the log-softmax over all positions
    dominate the step, and in agent trajectories most positions are prompt and observations.
    ``return_logits`` asks for the full ``[B, T-1, V]`` logits instead (every position)."""
    if return_logits:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        logits = out.logits[:, :-1, :].float()
        if temperature != 1.0:
            logits = logits / temperature
        logp = torch.log_softmax(logits, dim=-1).gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        return logp, logits
    keep = (batch.source[:, 1:] == SOURCE_POLICY).any(0).nonzero().squeeze(-1)
    if keep.numel() == 0:
        keep = torch.zeros(1, dtype=torch.long)
    logits = selected_logits(model, batch, keep).float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = batch.input_ids[:, 1:][:, keep]
    picked = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    logp = picked.new_zeros(batch.input_ids.shape[0], batch.input_ids.shape[1] - 1)
    logp = logp.index_copy(1, keep, picked)
    return logp, None


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
