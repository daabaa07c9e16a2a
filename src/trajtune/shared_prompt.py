"""Decoding the samples of one prompt against one copy of its keys and values (cascade attention).

Why: a GRPO group is 4-16 samples of the same prompt, and agent prompts are long (system prompt,
tool schemas) while the sampled turns are short. Laid out as a padded batch, every sample carries
its own copy of the prompt's cache, and each decoding step reads every copy: at batch 32 on
SmolLM2-135M that attention over ~480 cached tokens was a third of a step, done as 96 tiny
(3 x 64) x (64 x 480) products. Here each distinct prompt's cache is kept once, and a step's
attention is split in two exact parts merged by their softmax statistics (as in Hydragen or
FlashInfer's cascade attention):

- the prompt part: the queries of all samples of a prompt stacked into one product with its keys
  (M = samples x query heads per key head), read once per step;
- the own part: each sample's tokens since the prompt, in a small batch buffer; every row of it
  began the turn together, so all have the same length and no mask is needed.

``softmax([a, b]) V = (e^{m_a} (sum_a) o_a + e^{m_b} (sum_b) o_b) / (...)`` with each part's row max
``m``, sum of exponentials and unnormalised output: the same attention up to float rounding
(tests compare it with the padded layout). Only single-token decoding steps take this path, under
an attention implementation that is switched on for those forward passes alone
(``attention_implementation``), so training and prefill keep the model's own attention.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from trajtune.kv_cache import Layers, RowCache, buffer_layer_class

#: The attention implementation's registered name, and the forward keyword that carries the groups.
NAME = "trajtune_shared_prompt"


@dataclass
class PromptGroups:
    """Per distinct prompt, its cache's (keys, values) per layer, each ``[1, kv heads, P, dim]``, and
    the batch rows (a long tensor) that continue it."""

    prefixes: list[Layers]
    rows: list[torch.Tensor]


def shared_prompt_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, scaling: float | None = None,
                            dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """One decoding step: ``query`` ``[B, heads, 1, dim]``; ``key``/``value`` each row's own tokens
    since its prompt ``[B, kv heads, t, dim]`` (the same t for every row); the prompts' caches in
    ``kwargs[NAME]``. Returns ``[B, 1, heads, dim]`` as the model's attention functions do."""
    groups: PromptGroups | None = kwargs.get(NAME)
    if groups is None or query.shape[2] != 1:
        raise RuntimeError(f"attention implementation {NAME!r} serves single-token decoding steps given their "
                           f"prompt groups (keyword {NAME!r}); this forward pass did not pass them through")
    b, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    per_kv = heads // kv_heads
    scale = scaling if scaling is not None else dim ** -0.5
    # in at least float32 throughout (as SDPA accumulates): scores rounded to bfloat16 would flip tokens
    acc = torch.promote_types(query.dtype, torch.float32)
    q = query.reshape(b, kv_heads, per_kv, dim).to(acc)  # query head h reads key head h // per_kv
    key, value = key.to(acc), value.to(acc)
    # the rows' own tokens: per query, its output and the log of its softmax normaliser
    out_own, lse_own = attend(q, key, value, scale)  # [B, kv, per_kv, dim], [B, kv, per_kv]
    # each prompt once, for all the rows that continue it
    out_pre, lse_pre = torch.empty_like(out_own), torch.empty_like(lse_own)
    layer = module.layer_idx
    for prefix, rows in zip(groups.prefixes, groups.rows):
        kp, vp = prefix[layer][0].to(acc), prefix[layer][1].to(acc)
        n = rows.numel()
        qg = q.index_select(0, rows).transpose(0, 1).reshape(1, kv_heads, n * per_kv, dim)
        op, lp = attend(qg, kp, vp, scale)  # [1, kv, n * per_kv, dim], [1, kv, n * per_kv]
        out_pre.index_copy_(0, rows, op[0].view(kv_heads, n, per_kv, dim).transpose(0, 1))
        lse_pre.index_copy_(0, rows, lp[0].view(kv_heads, n, per_kv).transpose(0, 1))
    top = torch.maximum(lse_own, lse_pre)
    w_own, w_pre = torch.exp(lse_own - top).unsqueeze(-1), torch.exp(lse_pre - top).unsqueeze(-1)
    out = (out_own * w_own + out_pre * w_pre) / (w_own + w_pre)
    return out.to(query.dtype).reshape(b, heads, 1, dim).transpose(1, 2).contiguous(), None


#: Whether CPU attention parts go through torch's fused CPU kernel (tests turn it off to check the other path).
FUSED_ON_CPU = True


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(q k^T scale) v`` ``[N, H, L, dim]`` and the log of each query's softmax normaliser
    ``[N, H, L]`` (what merging two parts of one softmax needs). On CPU through torch's flash-attention
    kernel, which returns both: computed as separate products, scores, exponentials and sums, a
    batch-32 step's attention took ~23 % of the step (the prompt's keys leave the cache while the
    weights stream through it, and each small product waits on them)."""
    if FUSED_ON_CPU and q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, scale=scale)
        return out, lse
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    lse = torch.logsumexp(s, -1)
    return torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v), lse


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, shared_prompt_attention)


_register()


@contextmanager
def attention_implementation(config: Any, name: str) -> Iterator[None]:
    """``config``'s attention implementation set to ``name`` for the block. Not registering ``name``
    as a mask implementation is deliberate: the model then builds no attention mask, none being
    needed here."""
    old = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = old


def worth_sharing(caches: list[RowCache | None]) -> bool:
    """Whether the rows' caches are few enough distinct ones to decode against once each: at least
    two rows per cache on average (a GRPO group's first turn). One row per cache (distinct prompts,
    later turns) measured no faster than the padded batch, so it keeps that."""
    distinct = {id(c) for c in caches}
    return None not in caches and 2 * len(distinct) <= len(caches)


class SharedPromptBatch:
    """The live rows of a decoding turn, each continuing a prompt cache that several rows share:
    ``step`` runs one token per row, ``row_cache`` is a leaving row's whole cache, ``compact`` keeps
    the rows that go on (the ``_fill_from_the_end`` moves)."""

    def __init__(self, model: Any, cache_kw: str, caches: list[RowCache], room: int, config: Any):
        """``config``: the model's own config (under any PEFT wrapper), whose attention implementation
        ``step`` switches."""
        from transformers.cache_utils import Cache

        self.model, self.kw, self.config = model, cache_kw, config
        order: dict[int, int] = {}
        self.prefixes: list[RowCache] = []
        self.group: list[int] = []  # per row, its prompt's index in prefixes
        for c in caches:
            if id(c) not in order:
                order[id(c)] = len(self.prefixes)
                self.prefixes.append(c)
            self.group.append(order[id(c)])
        k0 = self.prefixes[0].layers[0][0]
        self.device = k0.device
        buffer_layer = buffer_layer_class()
        self.layers = [buffer_layer(k0.new_zeros((len(caches), k0.shape[1], room, k0.shape[3])),
                                    k0.new_zeros((len(caches), k0.shape[1], room, k0.shape[3])), 0)
                       for _ in self.prefixes[0].layers]
        self.cache = Cache(layers=self.layers)
        self.t = 0  # tokens each row holds past its prompt
        self._index()

    def _index(self) -> None:
        rows: dict[int, list[int]] = {}
        for b, g in enumerate(self.group):
            rows.setdefault(g, []).append(b)
        gs = sorted(rows)
        self.groups = PromptGroups([self.prefixes[g].layers for g in gs],
                                   [torch.tensor(rows[g], dtype=torch.long, device=self.device) for g in gs])

    def step(self, cur: torch.Tensor) -> torch.Tensor:
        pos = torch.tensor([self.prefixes[g].n + self.t for g in self.group], device=self.device).unsqueeze(1)
        with attention_implementation(self.config, NAME):
            out = self.model(input_ids=cur.unsqueeze(1), position_ids=pos, use_cache=True,
                             logits_to_keep=1, **{self.kw: self.cache, NAME: self.groups})
        self.t += 1
        return out.logits[:, -1, :].float()

    def row_cache(self, b: int) -> RowCache:
        prefix = self.prefixes[self.group[b]]
        own = [(lay.keys[b:b + 1].clone(), lay.values[b:b + 1].clone()) for lay in self.layers]  # slot b is reused
        return RowCache.joined_later(prefix, own, prefix.n + self.t)

    def compact(self, order: list[int], moves: list[tuple[int, int]]) -> None:
        self.group = [self.group[b] for b in order]
        for lay in self.layers:
            lay.compact(moves, len(order), 0)
        self._index()
