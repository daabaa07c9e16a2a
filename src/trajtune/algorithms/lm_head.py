"""Log-probs from the LM head in chunks of positions, so the ``[B, K, V]`` logits never exist at once.

Why: with a real vocabulary the logits can be the largest activation of a training step (SmolLM2's
49,152 tokens: 1,084 trained positions of float32 logits are 213 MB, and the log-softmax, its
gradient and the logits' gradient are as large again), while the hidden states they come from are
85× smaller.

How: the model runs as always (its decoder, final norm, adapters, ``logits_to_keep``) with its
output-embedding module, the LM head, swapped for the identity during the call, so what it returns
as ``logits`` are the final hidden states at the kept positions. Each chunk of positions then goes
through the real head (a LoRA layer on it included) and a float32 log-softmax inside a non-reentrant
activation checkpoint: the chunk's logits are freed after its forward and recomputed in the
backward, one chunk at a time. Each row of a matmul depends only on its own input row, so the
log-probs and gradients equal the unchunked computation's up to float rounding
(tests/test_lm_head.py checks 1e-9 in float64). The price is the head's forward once more in the
backward, for the positions that need logits only. A loss whose positions fit in one chunk gains
nothing from it: the model's own forward computes its logits, exactly as with chunking off.

Only model types whose causal-LM forward ends in ``logits = lm_head(hidden)`` (nothing after the
head: no softcapping, no logit scale) are split; the rest keep the model's own logits, with one
log line per reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.utils.checkpoint import checkpoint

log = logging.getLogger("trajtune.lm_head")

#: ``train.loss_chunk_tokens: auto``: positions per chunk so that a chunk's float32 logits take ≤ 64 MiB
AUTO_CHUNK_BYTES = 64 << 20
#: model types whose ``*ForCausalLM.forward`` applies the head last, to the (sliced) final hidden
#: states, as read in their transformers source; Gemma 2/3 (softcapping), Cohere (logit scale) and
#: Granite (logit scaling) change the logits after the head and are not here
SPLIT_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "smollm3", "phi3", "olmo2"})

ChunkTokens = int | Literal["auto"]
#: per-chunk statistics an objective wants besides the log-probs: (float32 logits [n, V], targets
#: [n, J]) → a tensor [n, S], computed without gradient (SFT: token accuracy, the EAFT gate)
Stats = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_told: set[str] = set()


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """Logits in float32 for the log-softmax (bf16 / fp16 models); a float64 model stays float64."""
    return x if x.dtype == torch.float64 else x.float()


def base_model(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (the model itself otherwise)."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def unsplit_reason(model: Any) -> str | None:
    """Why the LM head of ``model`` cannot be applied apart from its forward (None: it can)."""
    peft_cfg = getattr(model, "active_peft_config", None)
    if peft_cfg is not None and getattr(peft_cfg, "is_prompt_learning", False):
        return "a prompt-learning PEFT adapter"
    get = getattr(model, "get_output_embeddings", None)
    if not callable(get) or get() is None:
        return "no output embeddings (get_output_embeddings)"
    base = base_model(model)
    if _fsdp_sharded(base):  # the head's weights are gathered only inside the sharded root's forward
        return "a model sharded by FSDP (train.sharding: fsdp)"
    mt = getattr(getattr(base, "config", None), "model_type", None)
    if mt not in SPLIT_MODEL_TYPES:
        return f"model type {mt!r}"
    if getattr(type(base).forward, "__module__", None) != f"transformers.models.{mt}.modeling_{mt}":
        return f"a forward other than transformers' {mt}"
    return None


def _fsdp_sharded(model: Any) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch build without distributed support
        return False
    return isinstance(model, FSDPModule)


def _tell_once(reason: str) -> None:
    if reason not in _told:
        _told.add(reason)
        log.warning("chunked LM head (train.loss_chunk_tokens) is off for this model (%s): its full logits are "
                    "computed at once instead, with the same results and more memory", reason)


def chunk_positions(setting: ChunkTokens, vocab_size: int) -> int:
    """Positions per chunk for ``train.loss_chunk_tokens`` (0: no chunking)."""
    if setting == "auto":
        return max(1, AUTO_CHUNK_BYTES // (4 * vocab_size))
    return int(setting)


@dataclass
class HeadInput:
    """What a forward at the kept positions gives the loss: the final hidden states and the head to
    apply to them (``head`` set), or the model's logits already (``head`` None: not split)."""

    x: torch.Tensor  # [..., H] hidden states, or [..., V] logits
    head: Any | None
    rows: int  # positions per chunk (0: all at once)
    out: Any  # the model's output (hidden_states, cache)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


@contextmanager
def _hidden_instead_of_logits(head: Any) -> Iterator[None]:
    """The head returns its input for the duration; whatever forward the instance carried (an
    accelerate hook sets one) is put back."""
    had = "forward" in head.__dict__
    prev = head.__dict__.get("forward")
    head.forward = _identity
    try:
        yield
    finally:
        if had:
            head.forward = prev
        else:
            del head.forward


def _slice(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return x if x.shape[1] == keep.numel() else x[:, keep]  # the model ignored logits_to_keep


def _own_logits(model: Any, keep: torch.Tensor, kwargs: dict[str, Any]) -> HeadInput:
    try:
        out = model(**kwargs, logits_to_keep=keep)
    except TypeError:  # a model without the argument: the full forward, sliced
        out = model(**kwargs)
    return HeadInput(_slice(out.logits, keep), None, 0, out)


def forward_kept(model: Any, keep: torch.Tensor, chunk: ChunkTokens, positions: int, **kwargs: Any) -> HeadInput:
    """``model(**kwargs)`` at the positions ``keep`` (each predicting the next token), for a loss
    that sends ``positions`` of them through the head (rows × kept positions, or fewer: SFT's
    trained ones): hidden states and the head when they need more than one chunk of ``chunk`` and
    the head can be split; else the model's own logits, as with chunking off (one chunk would save
    nothing, and this keeps such steps exactly as they were)."""
    if chunk == 0:
        return _own_logits(model, keep, kwargs)
    reason = unsplit_reason(model)
    if reason is not None:
        _tell_once(reason)
        return _own_logits(model, keep, kwargs)
    rows = chunk_positions(chunk, int(base_model(model).config.vocab_size))
    if positions <= rows:
        return _own_logits(model, keep, kwargs)
    head = model.get_output_embeddings()
    with _hidden_instead_of_logits(head):
        out = model(**kwargs, logits_to_keep=keep)
    return HeadInput(_slice(out.logits, keep), head, rows, out)


def _chunk(head: Any | None, x: torch.Tensor, targets: torch.Tensor, temperature: float,
           stats: Stats | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log-softmax(head(x) / T) at ``targets`` [n, J], then ``stats``. The log-probs come first, so
    a checkpoint's recompute stops after them (early stop) and never redoes the statistics."""
    logits = at_least_float32(x if head is None else head(x))
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets)
    if stats is None:
        return logp, None
    with torch.no_grad():
        return logp, stats(logits, targets)


def head_logprobs(inp: HeadInput, targets: torch.Tensor, temperature: float = 1.0,
                  stats: Stats | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(targets) under the logits of ``inp`` at temperature T: ``targets`` is ``[..., J]`` (J
    candidate tokens per position; J > 1 when rows share a position, as a shared prefix's do), the
    result has the same shape; with ``stats``, also its statistics ``[..., S]``.

    Hidden states go through the head ``inp.rows`` positions at a time, each chunk checkpointed
    when a gradient is needed; logits are used as they are."""
    lead = targets.shape[:-1]
    x = inp.x.reshape(-1, inp.x.shape[-1])
    t = targets.reshape(x.shape[0], -1)
    rows = inp.rows if inp.head is not None and inp.rows > 0 else x.shape[0]
    if x.shape[0] <= rows:
        logp, st = _chunk(inp.head, x, t, temperature, stats)
    else:
        grad = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in inp.head.parameters()))
        parts = [checkpoint(_chunk, inp.head, x[i:i + rows], t[i:i + rows], temperature, stats, use_reentrant=False)
                 if grad else _chunk(inp.head, x[i:i + rows], t[i:i + rows], temperature, stats)
                 for i in range(0, x.shape[0], rows)]
        logp = torch.cat([p[0] for p in parts])
        st = None if stats is None else torch.cat([p[1] for p in parts])
    return logp.reshape(*lead, -1), (None if st is None else st.reshape(*lead, -1))
