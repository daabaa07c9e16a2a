"""Collating TokenTrajectories into tensors, and the log-probabilities every objective needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from trajtune.algorithms import prefix_share as ps
from trajtune.algorithms.lm_head import ChunkTokens, HeadInput, at_least_float32, forward_kept, head_logprobs
from trajtune.errors import DataError
from trajtune.models.adapters import DEFAULT, activate
from trajtune.tokens import SOURCE_PAD, SOURCE_POLICY, TokenTrajectory


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
    #: rows with a common token prefix compute it once (``token_logprobs``; ``train.share_prefix``)
    share_prefix: bool = False
    #: positions per chunk of the LM head and log-softmax (``trajtune.algorithms.lm_head``;
    #: ``train.loss_chunk_tokens``; 0: the model's own logits, all at once)
    loss_chunk_tokens: ChunkTokens = "auto"

    def loss_mask(self) -> torch.Tensor:
        """1.0 on trained policy tokens (source policy and weight > 0), shifted to target positions."""
        return ((self.source == SOURCE_POLICY) & (self.weight > 0)).float()[:, 1:]

    def to(self, device: torch.device | str) -> "Batch":
        kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return Batch(**kw)


def collate(tts: list[TokenTrajectory], pad_id: int, share_prefix: bool = False,
            loss_chunk_tokens: ChunkTokens = "auto") -> Batch:
    """``share_prefix``: ``token_logprobs`` on this batch computes a prefix that several rows share
    once (``trajtune.algorithms.prefix_share``); ``loss_chunk_tokens``: the log-probs go through the
    LM head that many positions at a time (``trajtune.algorithms.lm_head``). The learner sets both
    from ``train.share_prefix`` and ``train.loss_chunk_tokens``."""
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
    return Batch(ids, attn, src, w, old, ref, adv, rewards, b, **extra, adapters=adapters, share_prefix=share_prefix,
                 loss_chunk_tokens=loss_chunk_tokens)


def select_rows(batch: Batch, rows: list[int]) -> Batch:
    """The sub-batch of ``rows`` (same width; per-row fields taken along)."""
    idx = torch.tensor(rows, dtype=torch.long, device=batch.input_ids.device)
    kw = {k: (v.index_select(0, idx) if isinstance(v, torch.Tensor) else v) for k, v in batch.__dict__.items()}
    kw["size"] = len(rows)
    kw["adapters"] = [batch.adapters[r] for r in rows] if batch.adapters is not None else None
    return Batch(**kw)


def merge_metrics(into: dict[str, Any], m: dict[str, Any]) -> None:
    """Add a sub-batch's metrics: (sum, count) pairs and plain sums alike."""
    for k, v in m.items():
        if isinstance(v, tuple):
            old = into.get(k, (0.0, 0.0))
            into[k] = (old[0] + v[0], old[1] + v[1])
        else:
            into[k] = into.get(k, 0.0) + v


def by_adapter(model: Any, batch: Batch, loss_sum: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """``loss_sum(model, rows)`` over the rows of each adapter (``batch.adapters``) with that adapter
    active, summed: each adapter is in the forward pass of its own rows only, so its gradient comes
    from them alone (another adapter's rows leave it exactly zero). The default adapter is active after."""
    adapters = batch.adapters or [DEFAULT] * batch.size
    total: torch.Tensor | None = None
    metrics: dict[str, Any] = {}
    try:
        for a in dict.fromkeys(adapters):
            activate(model, a)
            loss, m = loss_sum(model, select_rows(batch, [r for r, x in enumerate(adapters) if x == a]))
            total = loss if total is None else total + loss
            merge_metrics(metrics, m)
    finally:
        activate(model, DEFAULT)
    assert total is not None
    return total, metrics


def token_logprobs(model: Any, batch: Batch, temperature: float = 1.0,
                   return_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(token_t | tokens_<t) for t = 1..T-1, shape [B, T-1], at every position that predicts a
    policy token in some row; other positions hold 0 (no objective reads them: their mask is 0).

    Why only there: with a real vocabulary the LM head and the log-softmax over all positions
    dominate the step, and in agent trajectories most positions are prompt and observations.
    ``return_logits`` asks for the full ``[B, T-1, V]`` logits instead (every position)."""
    if return_logits:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        logits = at_least_float32(out.logits[:, :-1, :])
        if temperature != 1.0:
            logits = logits / temperature
        logp = torch.log_softmax(logits, dim=-1).gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        return logp, logits
    keep = (batch.source[:, 1:] == SOURCE_POLICY).any(0).nonzero().squeeze(-1)
    if keep.numel() == 0:
        keep = torch.zeros(1, dtype=torch.long)
    if batch.share_prefix and batch.size > 1:
        shared = _shared_prefix_logprobs(model, batch, keep, temperature)
        if shared is not None:
            return shared, None
    return _plain_logprobs(model, batch, keep, temperature), None


def kept_head_input(model: Any, batch: Batch, keep: torch.Tensor, positions: int | None = None,
                    **kwargs: Any) -> HeadInput:
    """The forward of ``batch`` at the hidden-state positions ``keep`` (each predicting the next
    token): the hidden states (or logits) that ``head_logprobs`` turns into log-probs, chunk by
    chunk. ``positions``: how many go through the head (default: every row at every kept position)."""
    n = batch.input_ids.shape[0] * keep.numel() if positions is None else positions
    return forward_kept(model, keep, batch.loss_chunk_tokens, n, input_ids=batch.input_ids,
                        attention_mask=batch.attention_mask, use_cache=False, **kwargs)


def _plain_logprobs(model: Any, batch: Batch, keep: torch.Tensor, temperature: float) -> torch.Tensor:
    targets = batch.input_ids[:, 1:][:, keep]
    picked = head_logprobs(kept_head_input(model, batch, keep), targets.unsqueeze(-1), temperature)[0].squeeze(-1)
    logp = picked.new_zeros(batch.input_ids.shape[0], batch.input_ids.shape[1] - 1)
    return logp.index_copy(1, keep, picked)


def _shared_prefix_logprobs(model: Any, batch: Batch, keep: torch.Tensor,
                            temperature: float) -> torch.Tensor | None:
    """``token_logprobs`` with each group of rows that shares a prefix computing it once; None when
    no rows share one (or the model cannot), so the caller runs the plain forward.

    Positions past a row's end (padding, where no objective reads) hold 0 here, where the plain
    forward holds the log-prob of a pad token."""
    lengths = batch.attention_mask.sum(1).tolist()
    seqs = [row[:n] for row, n in zip(batch.input_ids.tolist(), lengths)]
    groups = ps.find_groups(seqs)
    if not groups:
        return None
    reason = ps.unsupported_reason(model)
    if reason is not None:
        ps._tell_once(reason)
        return None
    keep = keep.to(batch.input_ids.device)
    b, t = batch.input_ids.shape
    rows_out: dict[int, torch.Tensor] = {}
    for rows, p in groups:
        pos, lp = ps.group_logprobs(model, batch.input_ids, batch.attention_mask, rows, p, keep, temperature,
                                    batch.loss_chunk_tokens)
        full = lp.new_zeros(len(rows), t - 1).index_copy(1, pos, lp)
        rows_out.update(zip(rows, full.unbind(0)))
    alone = [r for r in range(b) if r not in rows_out]
    if alone:  # the rows without a sharer: one plain forward, cut to their width
        idx = torch.tensor(alone, dtype=torch.long, device=batch.input_ids.device)
        width = int(max(lengths[r] for r in alone))
        sub = Batch(batch.input_ids[idx, :width], batch.attention_mask[idx, :width], batch.source[idx, :width],
                    batch.weight[idx, :width], batch.old_logprobs[idx, :width], None, batch.advantages[idx, :width],
                    batch.rewards[idx], len(alone), loss_chunk_tokens=batch.loss_chunk_tokens)
        sub_keep = keep[keep < width - 1]
        if sub_keep.numel() == 0:
            sub_keep = keep[:1].clamp(max=max(0, width - 2))
        lp = _plain_logprobs(model, sub, sub_keep, temperature) if width > 1 else None
        pad = t - 1 - (lp.shape[1] if lp is not None else 0)
        zeros = batch.input_ids.new_zeros((len(alone), pad), dtype=lp.dtype if lp is not None else torch.float)
        full = zeros if lp is None else torch.cat([lp, zeros], dim=1)
        rows_out.update(zip(alone, full.unbind(0)))
    return torch.stack([rows_out[r] for r in range(b)])


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
