"""Shared-prefix log-probs: rows of one micro-batch that start with the same tokens (a GRPO group's
prompt, a DPO pair's prompt, several attempts at one task, multi-turn episodes of one task) run
that prefix through the model once; each row's remaining tokens attend to it through the KV cache.

Exact: the prefix's keys and values are expanded (a view) to the group's rows, so autograd sums the
gradient of every row that reads them back into the one prefix pass. The log-probs and gradients
equal the plain forward's up to float rounding (tests/test_prefix_share.py checks 1e-9 in float64).

What is shared is found from the token ids, never assumed: rows are sorted by their tokens, and the
sorted order is cut into runs whose common prefix (at least ``MIN_PREFIX`` tokens, and shorter than
every member, so each keeps at least one token of its own) saves the most recomputed tokens. Needed
logits inside the prefix (a policy token there: multi-turn episodes that diverge after a shared
first turn) come from the prefix pass.

Only plain full-attention decoders (Llama, Qwen2, Qwen3, Mistral without a sliding window; bare or
under a LoRA adapter) with eager or SDPA attention are shared; anything else falls back to the plain
forward, which gives identical results, with one log line per reason.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch

from trajtune.algorithms.lm_head import ChunkTokens, HeadInput, base_model, forward_kept, head_logprobs

log = logging.getLogger("trajtune.prefix_share")

#: the shortest prefix worth a separate pass
MIN_PREFIX = 16
SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
SUPPORTED_ATTENTION = frozenset({"eager", "sdpa"})

_told: set[str] = set()


def _tell_once(reason: str) -> None:
    if reason not in _told:
        _told.add(reason)
        log.warning("shared-prefix training (train.share_prefix) is off for this model (%s): the plain forward "
                    "runs instead, with the same results", reason)


def unsupported_reason(model: Any) -> str | None:
    """Why ``model`` cannot share prefixes (None: it can)."""
    peft_cfg = getattr(model, "active_peft_config", None)
    if peft_cfg is not None and getattr(peft_cfg, "is_prompt_learning", False):
        return "a prompt-learning PEFT adapter"
    base = base_model(model)
    cfg = getattr(base, "config", None)
    mt = getattr(cfg, "model_type", None)
    if mt not in SUPPORTED_MODEL_TYPES:
        return f"model type {mt!r}"
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types and any(t != "full_attention" for t in layer_types):
        return f"{mt} with sliding-window layers"
    if mt == "mistral" and getattr(cfg, "sliding_window", None) is not None:
        return "mistral with a sliding window"
    if getattr(cfg, "use_sliding_window", False):
        return f"{mt} with use_sliding_window"
    impl = getattr(cfg, "_attn_implementation", None)
    if impl not in SUPPORTED_ATTENTION:
        return f"attention implementation {impl!r}"
    if _cache_classes() is None:
        return "this transformers version's cache API"
    if _cache_kwarg(base) is None:
        return "a forward without a cache argument"
    if _checkpointing(model):
        if not _can_keep_cache_under_checkpointing(model):
            return "gradient checkpointing that drops the KV cache in this transformers version"
        if not _non_reentrant(model):  # a reentrant checkpoint runs its forward without grad: the cache
            return "reentrant gradient checkpointing"  # it writes would carry no gradient back
    return None


# -- the cache --------------------------------------------------------------------------------------

_CLASSES: tuple[type, type, type] | None | bool = False


def _cache_classes() -> tuple[type, type, type] | None:
    """(Cache, recording layer, frozen-prefix layer) for the installed transformers; None without them."""
    global _CLASSES
    if _CLASSES is not False:
        return _CLASSES  # type: ignore[return-value]
    try:
        from transformers.cache_utils import Cache, DynamicLayer
    except ImportError:
        _CLASSES = None
        return None

    class RecordLayer(DynamicLayer):  # type: ignore[misc, valid-type]
        """Keeps the keys and values of one pass (overwriting, so a checkpoint's recompute is harmless)."""

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            self.keys, self.values = key_states, value_states
            self.device = key_states.device
            self.is_initialized = True
            return key_states, value_states

    class PrefixLayer(DynamicLayer):  # type: ignore[misc, valid-type]
        """Read-only prefix: each call returns prefix + the new states and stores nothing, so a
        checkpointed layer's recompute sees the very same inputs."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
            super().__init__()
            self.keys, self.values = keys, values
            self.device = keys.device
            self.is_initialized = True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)

    _CLASSES = (Cache, RecordLayer, PrefixLayer)
    return _CLASSES


def _cache_kwarg(base: Any) -> str | None:
    """The name the forward takes a cache under (``cache`` since transformers 5.x, ``past_key_values`` before)."""
    try:
        params = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return None
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None


def _checkpoint_layers(model: Any) -> list[Any]:
    """The decoder layers that checkpoint (transformers' ``GradientCheckpointingLayer`` with it on)."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # no such class: any module that says it checkpoints
        GradientCheckpointingLayer = torch.nn.Module  # type: ignore[misc, assignment]
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)
            and getattr(m, "gradient_checkpointing", False) is True]


def _checkpointing(model: Any) -> bool:
    return bool(model.training and torch.is_grad_enabled() and _checkpoint_layers(model))


def _can_keep_cache_under_checkpointing(model: Any) -> bool:
    # transformers' GradientCheckpointingLayer drops the cache unless the layer says it may keep it
    return all(hasattr(type(m), "_can_checkpoint_with_cache") for m in _checkpoint_layers(model))


def _non_reentrant(model: Any) -> bool:
    import functools

    for m in _checkpoint_layers(model):
        f = getattr(m, "_gradient_checkpointing_func", None)
        if not (isinstance(f, functools.partial) and f.keywords.get("use_reentrant") is False):
            return False
    return True


class _KeepCache:
    """Under gradient checkpointing, let the decoder layers keep our cache for this call. Safe: the
    prefix pass's cache only records (a recompute overwrites it with equal tensors) and the suffix
    pass's cache is read-only, so each recompute replays exactly the forward it replaces."""

    def __init__(self, model: Any) -> None:
        self.layers = _checkpoint_layers(model) if _checkpointing(model) else []

    def __enter__(self) -> None:
        for m in self.layers:
            m._can_checkpoint_with_cache = True

    def __exit__(self, *exc: Any) -> None:
        for m in self.layers:
            m.__dict__.pop("_can_checkpoint_with_cache", None)


# -- which rows share what --------------------------------------------------------------------------

def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def find_groups(seqs: list[list[int]], min_prefix: int = MIN_PREFIX) -> list[tuple[list[int], int]]:
    """Groups of ≥ 2 rows and their shared prefix length P, as (rows in ascending order, P).

    P is a common prefix of every member, at least ``min_prefix`` and below every member's length.
    Rows are sorted by their tokens (rows with a common prefix become neighbours; the common prefix
    of a run is the minimum of its neighbours' ones), then the order is cut into runs maximising
    the tokens not recomputed, Σ (rows − 1) · P, by dynamic programming."""
    order = sorted(range(len(seqs)), key=lambda r: seqs[r])
    n = len(order)
    # adj[k]: what order[k-1] and order[k] may share (each keeps ≥ 1 token of its own)
    adj = [0] + [min(_lcp(seqs[order[k - 1]], seqs[order[k]]), len(seqs[order[k - 1]]) - 1,
                     len(seqs[order[k]]) - 1) for k in range(1, n)]
    best = [0] * (n + 1)  # best[j]: the saving on order[:j]
    cut: list[tuple[int, int]] = [(0, 0)] * (n + 1)  # (start of the last run, its P)
    for j in range(1, n + 1):
        best[j], cut[j] = best[j - 1], (j - 1, 0)  # order[j-1] alone
        p = None
        for i in range(j - 2, -1, -1):  # the run order[i:j]
            p = adj[i + 1] if p is None else min(p, adj[i + 1])
            if p < min_prefix:
                break
            gain = best[i] + (j - 1 - i) * p
            if gain > best[j]:
                best[j], cut[j] = gain, (i, p)
    groups: list[tuple[list[int], int]] = []
    j = n
    while j > 0:
        i, p = cut[j]
        if j - i >= 2:
            groups.append((sorted(order[i:j]), p))
        j = i
    return sorted(groups)


# -- the forward ------------------------------------------------------------------------------------

def _call(model: Any, kwarg: str, cache: Any, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor,
          keep: torch.Tensor, chunk: ChunkTokens) -> HeadInput:
    # under checkpointing transformers turns use_cache off (with a warning); the cache passed is used either way
    return forward_kept(model, keep, chunk, ids.shape[0] * keep.numel(), input_ids=ids, attention_mask=attn,
                        position_ids=pos, use_cache=not _checkpointing(model), **{kwarg: cache})


def group_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: list[int], p: int,
                   keep: torch.Tensor, temperature: float,
                   chunk: ChunkTokens = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """log-probs of ``rows`` (sharing their first ``p`` tokens) at the positions ``keep`` (each
    predicting the next token) that fall inside the group's width: (positions, [rows, positions]).
    ``chunk``: positions per chunk of the LM head (``trajtune.algorithms.lm_head``)."""
    classes = _cache_classes()
    assert classes is not None
    cache_cls, record_cls, prefix_cls = classes
    base = base_model(model)
    kwarg = _cache_kwarg(base)
    assert kwarg is not None
    n_layers = base.config.get_text_config(decoder=True).num_hidden_layers
    dev = input_ids.device
    idx = torch.tensor(rows, dtype=torch.long, device=dev)
    ids, attn = input_ids.index_select(0, idx), attention_mask.index_select(0, idx)
    k = len(rows)
    width = int(attn.sum(1).max())  # the last token's logit predicts nothing: the suffix pass stops before it
    kp = keep[keep < p]
    ks = keep[(keep >= p) & (keep < width - 1)]
    parts_pos, parts_lp = [], []
    with _KeepCache(model):
        record = cache_cls(layers=[record_cls() for _ in range(n_layers)])
        lp_keep = kp if kp.numel() else torch.tensor([p - 1], dtype=torch.long, device=dev)
        inp = _call(model, kwarg, record, ids[:1, :p], attn[:1, :p], torch.arange(p, device=dev).unsqueeze(0),
                    lp_keep, chunk)
        if kp.numel():  # one log-softmax per prefix position, read at every row's next token there
            lp, _ = head_logprobs(inp, ids[:, kp + 1].T.unsqueeze(0), temperature)
            parts_lp.append(lp[0].T)
            parts_pos.append(kp)
        layers = [prefix_cls(layer.keys.expand(k, -1, -1, -1), layer.values.expand(k, -1, -1, -1))
                  for layer in record.layers]
        if ks.numel():
            prefix = cache_cls(layers=layers)
            pos = torch.arange(p, width - 1, device=dev).unsqueeze(0).expand(k, -1)
            inp = _call(model, kwarg, prefix, ids[:, p:width - 1], attn[:, :width - 1], pos, ks - p, chunk)
    if ks.numel():
        parts_lp.append(head_logprobs(inp, ids[:, ks + 1].unsqueeze(-1), temperature)[0].squeeze(-1))
        parts_pos.append(ks)
    if not parts_pos:
        return keep[:0], ids.new_zeros((k, 0), dtype=torch.float)
    return torch.cat(parts_pos), torch.cat(parts_lp, dim=1)
