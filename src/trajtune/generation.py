"""Batched sampling for multi-turn rollouts that keeps every episode's KV cache between turns.

Why not ``model.generate`` each turn: it re-encodes the whole history (system prompt, tools, every
earlier turn) before each new turn, keeps ``[batch, new tokens, vocab]`` float logits, and a row
that has finished keeps being computed until the longest row is done. Here:

- each episode owns its cache (per layer, ``[1, heads, n, dim]``, no padding inside); a turn
  encodes only the tokens added since (the last sampled token, the observation, the next
  generation prompt), rows of similar length together in passes of at most ``PREFILL_TOKENS``
  padded tokens; identical first prompts (a GRPO group) are encoded once, and the prefix that
  first prompts share (system prompt, tools) once for all;
- decoding runs the live rows as one batch, their caches left-aligned with padding that the
  attention mask hides and explicit position ids, so every row sees exactly its own tokens;
- rows that continue one cache (a GRPO group's first turn: the same prompt, encoded once) decode
  against that one copy instead (``shared_prompt``: cascade attention), not a copy per row;
- a row that ends its turn leaves the batch at once (its cache is cut out), so finished rows cost
  nothing;
- per step only the sampled token's log-probability is kept (at the sampling temperature, before
  top-p, as the objectives recompute it).

Only models whose cache is a plain per-layer key/value store are served (Llama, Qwen2/3, Mistral
without a sliding window, …); ``supports`` says so, and rollouts fall back to ``generate`` for
the others (sliding-window, hybrid and recurrent layers).

``sampler_for`` is the one place that picks how a model's turns are sampled, for rollouts and
evaluation alike: a sampler the model carries itself (``SAMPLER_HOOK``, e.g. a DualTune model's
two-stage decoding, set by the algorithm that trained or loaded it), else this cached sampler,
else None (the caller's ``generate`` path). So generic code never names an algorithm's decoder.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from trajtune.kv_cache import Layers, RowCache, buffer_layer_class
from trajtune.shared_prompt import SharedPromptBatch, worth_sharing

def _core(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def cache_kwarg(model: Any) -> str | None:
    params = inspect.signature(type(_core(model)).forward).parameters
    for name in ("cache", "past_key_values"):  # transformers renamed it in 5.x
        if name in params:
            return name
    return None


def supports(model: Any) -> bool:
    """Whether the cached sampler can serve ``model``: a cache keyword in its forward and only
    full-attention layers (no sliding window, no recurrent or convolutional state)."""
    cfg = getattr(_core(model), "config", None)
    if cfg is None or cache_kwarg(model) is None:
        return False
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return False
    if getattr(cfg, "sliding_window", None) is not None and getattr(cfg, "use_sliding_window", True):
        return False
    return getattr(cfg, "model_type", "") in SUPPORTED_TYPES


#: Architectures whose attention is plain causal self-attention with rotary or learned positions
#: taken from ``position_ids``, checked against ``generate`` by the tests (tiny Qwen2 and Llama).
SUPPORTED_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral", "smollm3", "phi3", "olmo2", "granite"})


def _right_aligned(rows: list[RowCache | None], width: int, room: int = 0) -> Layers:
    """The rows' caches as batch tensors ``[B, heads, width + room, dim]`` per layer, each row's
    keys/values ending at position ``width`` (zeros before, for the attention mask to hide; a row
    without a cache is all zeros), ``room`` free positions after."""
    ref = next(row for row in rows if row is not None)
    out: Layers = []
    for li in range(ref.n_layers):
        k0, v0 = ref.pieces(li)[0]
        k = k0.new_zeros((len(rows), k0.shape[1], width + room, k0.shape[3]))
        v = v0.new_zeros((len(rows), v0.shape[1], width + room, v0.shape[3]))
        for b, row in enumerate(rows):
            if row is not None:
                at = width - row.n
                for pk, pv in row.pieces(li):  # a prompt and a row's own tokens, copied without joining them
                    k[b, :, at:at + pk.shape[2]] = pk[0]
                    v[b, :, at:at + pk.shape[2]] = pv[0]
                    at += pk.shape[2]
        out.append((k, v))
    return out


def _common_prefix(seqs: list[list[int]]) -> int:
    n = min(len(x) for x in seqs)
    first = seqs[0]
    for i in range(n):
        t = first[i]
        if any(x[i] != t for x in seqs):
            return i
    return n


def shared_prompt_prefix(seqs: list[list[int]]) -> int:
    """How many leading tokens a first turn encodes once for all of ``seqs`` (their system prompt
    and tools): their common prefix, less a token so that every row keeps one to predict from, or 0
    when that is under 8 tokens (not worth a pass of its own)."""
    p = min(_common_prefix(seqs), min(len(x) for x in seqs) - 1)
    return p if p >= 8 else 0


#: The attribute (on the model, or on the PeftModel inside an accelerate/DDP wrapper) holding the
#: model's own sampler factory: ``(model, tokenizer, temperature, top_p, stop_ids) -> sampler | None``,
#: the sampler with ``CachedSampler.turn``'s signature (None: the model needs no sampler of its own).
SAMPLER_HOOK = "trajtune_sampler"


def carried_sampler(model: Any) -> Callable[..., Any] | None:
    """The sampler factory ``model`` carries (``SAMPLER_HOOK``), looked up through wrappers' ``module``.
    Read from ``__dict__``: a PeftModel forwards unknown attributes to its base model."""
    m = model
    while SAMPLER_HOOK not in m.__dict__ and hasattr(m, "module"):
        m = m.module
    return m.__dict__.get(SAMPLER_HOOK)


def sampler_for(model: Any, tokenizer: Any, *, temperature: float, top_p: float, stop_ids: list[int],
                reuse_cache: bool = True, share_prompt: bool = True) -> Any | None:
    """How ``model``'s turns are sampled: the model's own sampler (``carried_sampler``), else the
    cached sampler when ``reuse_cache`` and the model's layers allow it (``supports``), else None:
    the caller decodes with ``generate`` (``rollout._generate``). ``share_prompt``: the cached sampler
    decodes a prompt's samples against one copy of its cache (``shared_prompt``)."""
    own = carried_sampler(model)
    if own is not None:
        sampler = own(model, tokenizer, temperature, top_p, stop_ids)
        if sampler is not None:
            return sampler
    if reuse_cache and supports(model):
        return CachedSampler(model, temperature, top_p, stop_ids, share_prompt=share_prompt)
    return None


#: Padded new tokens one prefill pass may hold (rows x longest new segment), on a CPU. Short
#: segments (a turn's observation after a long cache) still go many rows per pass, where batching
#: pays; long distinct prompts go alone or in small groups of similar length
#: (``benchmarks/prefill_speed.py``: 256 was the best of 1 to 1024 on SmolLM2-135M).
PREFILL_TOKENS = 256

#: The same on an accelerator, where a wide pass keeps the device busy. Not measured here (no GPU
#: in the project's CI); large enough that a batch of a few dozen long prompts goes in 1-4 passes.
PREFILL_TOKENS_ACCELERATOR = 32768


def _prefill_groups(items: list[tuple[RowCache | None, list[int]]], budget: int) -> list[list[int]]:
    """Indices of ``items`` in passes: sorted by new-segment length (then cache length), a pass
    grows while rows x its longest segment stays within ``budget`` (a longer row goes alone)."""
    order = sorted(range(len(items)), key=lambda i: (len(items[i][1]), items[i][0].n if items[i][0] else 0))
    groups: list[list[int]] = []
    for i in order:
        if groups and len(items[i][1]) * (len(groups[-1]) + 1) <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class CachedSampler:
    """Samples one assistant turn for many episodes, each continuing from its own cache."""

    def __init__(self, model: Any, temperature: float, top_p: float, stop_ids: list[int],
                 share_prompt: bool = True):
        self.model = model
        self.share_prompt = share_prompt
        self.kw = cache_kwarg(model)
        self.temperature = temperature
        self.top_p = top_p
        self.stops = set(stop_ids)
        self.device = next(model.parameters()).device
        self.prefill_tokens = PREFILL_TOKENS if self.device.type == "cpu" else PREFILL_TOKENS_ACCELERATOR

    # -- forward passes -----------------------------------------------------------------------------
    def _prefill(self, items: list[tuple[RowCache | None, list[int]]]) -> list[tuple[torch.Tensor, RowCache]]:
        """Encode each row's new tokens after its cached ones; per row the logits for what comes next
        and its extended cache. Rows go in passes of similar length (``_prefill_groups``): one pass
        over distinct long prompts pads every row to the longest and runs its elementwise work and
        masked attention over all that padding, which on a CPU made 32 function-calling prompts
        (237 to 835 tokens) 2.7 times slower than passes of at most 256 tokens."""
        results: list[tuple[torch.Tensor, RowCache] | None] = [None] * len(items)
        for group in _prefill_groups(items, self.prefill_tokens):
            for i, res in zip(group, self._prefill_pass([items[i] for i in group])):
                results[i] = res
        return results  # type: ignore[return-value]

    def _prefill_pass(self, items: list[tuple[RowCache | None, list[int]]]) -> list[tuple[torch.Tensor, RowCache]]:
        """Encode each row's new tokens after its cached ones, all rows in one forward pass; per row
        the logits for what comes next and its extended cache.

        Layout: the caches right-aligned in the first W positions (holes on the left), then the new
        tokens left-aligned in the next M (padding on the right). Real tokens never see a hole
        (masked) or a pad (it comes after them), and every pad sees its row's real tokens, so no
        attention row is empty."""
        from transformers import DynamicCache
        from transformers.cache_utils import Cache

        b = len(items)
        have = [row.n if row is not None else 0 for row, _ in items]
        news = [len(ids) for _, ids in items]
        width, m = max(have), max(news)
        x = torch.zeros((b, m), dtype=torch.long, device=self.device)
        mask = torch.zeros((b, width + m), dtype=torch.long, device=self.device)
        for r, (_, ids) in enumerate(items):
            x[r, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[r, width - have[r]:width + len(ids)] = 1
        pos = torch.tensor(have, device=self.device).unsqueeze(1) + torch.arange(m, device=self.device)
        keep = sorted({n - 1 for n in news})  # the LM head only where some row's next token is predicted
        if width:  # the caches copied once, into buffers with room for the new tokens
            buffer_layer = buffer_layer_class()
            cache = Cache(layers=[buffer_layer(k, v, width)
                                  for k, v in _right_aligned([row for row, _ in items], width, room=m)])
        else:
            cache = DynamicCache()
        out = self.model(input_ids=x, position_ids=pos, attention_mask=mask, use_cache=True,
                         logits_to_keep=torch.tensor(keep, device=self.device), **{self.kw: cache})
        logits = out.logits.float()
        results = []
        for r in range(b):
            lo, hi = width - have[r], width + news[r]
            # the row's cached and new tokens are adjacent (lo..width..hi): a view, not a copy
            row_layers = [(lay.keys[r:r + 1, :, lo:hi], lay.values[r:r + 1, :, lo:hi]) for lay in cache.layers]
            results.append((logits[r, keep.index(news[r] - 1)], RowCache(row_layers, have[r] + news[r])))
        return results

    # -- sampling -------------------------------------------------------------------------------
    def _pick(self, logits: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Next token per row and its log-prob (at the sampling temperature, before top-p)."""
        if self.temperature <= 0:
            tok = logits.argmax(-1)
            return tok, torch.log_softmax(logits, -1).gather(-1, tok.unsqueeze(-1)).squeeze(-1)
        logp = torch.log_softmax(logits if self.temperature == 1.0 else logits / self.temperature, -1)
        probs = logp.exp()
        if self.top_p < 1.0:
            sp, idx = probs.sort(-1, descending=True)
            drop = (sp.cumsum(-1) - sp) > self.top_p  # keep the smallest head whose mass reaches top_p
            sp = sp.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, idx, sp)
        tok = _inverse_cdf(probs, gen).to(logits.device)
        return tok, logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def turn(self, rows: list[tuple[RowCache | None, list[int]]], max_new: list[int],
             seed: int) -> list[tuple[list[int], list[float], bool, RowCache]]:
        """One turn per row: ``rows`` are (cache or None, tokens added since it), ``max_new`` the
        room per row. Returns (new ids, their log-probs, ended with a stop token, the row's cache).
        The returned cache holds every token but the last sampled one."""
        gen = torch.Generator().manual_seed(seed % (2**63))
        n = len(rows)
        if any(not new for _, new in rows):
            raise ValueError("a row needs at least one new token to continue from")
        unique, which = _dedupe_rows(rows)
        self._share_prompt_prefix(unique)
        done = self._prefill(unique)
        caches: list[RowCache | None] = [done[u][1] for u in which]
        tok, lp = self._pick(torch.stack([done[u][0] for u in which]), gen)
        out_ids: list[list[int]] = [[int(t)] for t in tok]
        out_lps: list[list[float]] = [[float(x)] for x in lp]
        ended = [int(t) in self.stops for t in tok]
        live = [r for r in range(n) if not ended[r] and len(out_ids[r]) < max_new[r]]
        if live:
            self._decode(live, caches, out_ids, out_lps, ended, max_new, gen)
        return [(out_ids[r], out_lps[r], ended[r], caches[r]) for r in range(n)]  # type: ignore[misc]

    def _share_prompt_prefix(self, unique: list[tuple[RowCache | None, list[int]]]) -> None:
        """First prompts share the system prompt and tools: encode that prefix once, and let each
        fresh row continue from its cache (rows are replaced in ``unique``)."""
        fresh = [u for u, (row, _) in enumerate(unique) if row is None]
        if len(fresh) > 1:
            seqs = [unique[u][1] for u in fresh]
            p = shared_prompt_prefix(seqs)
            if p:
                ((_, shared),) = self._prefill([(None, seqs[0][:p])])
                for u in fresh:
                    unique[u] = (shared, unique[u][1][p:])

    def _decode(self, live: list[int], caches: list[RowCache | None], out_ids: list[list[int]],
                out_lps: list[list[float]], ended: list[bool], max_new: list[int], gen: torch.Generator) -> None:
        """Sample the ``live`` rows token by token as one batch until each stops or runs out of room;
        a row that leaves has its cache cut out of the batch into ``caches`` (the lists are updated
        in place). Rows that continue a prompt cache they share (a group's first turn) decode
        against one copy of it (``shared_prompt``); others sit in a padded batch."""
        room = max(max_new[r] for r in live)
        rows = [caches[r] for r in live]
        batch: Any
        if self.share_prompt and worth_sharing(rows):
            batch = SharedPromptBatch(self.model, self.kw, rows, room,  # type: ignore[arg-type]
                                      _core(self.model).config)
        else:
            batch = _PaddedBatch(self.model, self.kw, rows, room)
        cur = torch.tensor([out_ids[r][-1] for r in live], device=self.device)
        while live:
            tok, lp = self._pick(batch.step(cur), gen)
            keep = []
            for b, r in enumerate(live):
                t = int(tok[b])
                out_ids[r].append(t)
                out_lps[r].append(float(lp[b]))
                if t in self.stops:
                    ended[r] = True
                if ended[r] or len(out_ids[r]) >= max_new[r]:  # leaves the batch: cut its cache out
                    caches[r] = batch.row_cache(b)
                else:
                    keep.append(b)
            if len(keep) < len(live):
                if not keep:
                    break
                order, moves = _fill_from_the_end(keep, len(live))
                live = [live[b] for b in order]
                batch.compact(order, moves)
                tok = tok.index_select(0, torch.tensor(order, device=tok.device))
            cur = tok


class _PaddedBatch:
    """The live rows of a decoding turn in one batch: their caches right-aligned in
    ``[B, heads, L + room, dim]`` buffers, the padding before them hidden by the attention mask, and
    explicit position ids, so every row sees exactly its own tokens. ``step``, ``row_cache`` and
    ``compact`` as ``shared_prompt.SharedPromptBatch``'s."""

    def __init__(self, model: Any, cache_kw: str, rows: list[RowCache | None], room: int):
        from transformers.cache_utils import Cache

        self.model, self.kw = model, cache_kw
        self.lens = [row.n for row in rows]  # type: ignore[union-attr]
        width = max(self.lens)
        buffer_layer = buffer_layer_class()
        self.layers = [buffer_layer(k, v, width) for k, v in _right_aligned(rows, width, room)]
        self.cache = Cache(layers=self.layers)
        self.device = self.layers[0].keys.device
        self.mask = torch.zeros((len(rows), width), dtype=torch.long, device=self.device)
        for b, m in enumerate(self.lens):
            self.mask[b, width - m:] = 1

    def step(self, cur: torch.Tensor) -> torch.Tensor:
        pos = torch.tensor(self.lens, device=self.device).unsqueeze(1)
        self.mask = torch.cat([self.mask, torch.ones((len(self.lens), 1), dtype=torch.long, device=self.device)], 1)
        out = self.model(input_ids=cur.unsqueeze(1), position_ids=pos, attention_mask=self.mask, use_cache=True,
                         logits_to_keep=1, **{self.kw: self.cache})
        self.lens = [m + 1 for m in self.lens]
        return out.logits[:, -1, :].float()

    def row_cache(self, b: int) -> RowCache:
        w, n = self.mask.shape[1], self.lens[b]
        return RowCache([(lay.keys[b:b + 1, :, w - n:].clone(), lay.values[b:b + 1, :, w - n:].clone())
                         for lay in self.layers], n)

    def compact(self, order: list[int], moves: list[tuple[int, int]]) -> None:
        self.lens = [self.lens[b] for b in order]
        trim = self.mask.shape[1] - max(self.lens)  # padding every remaining row has
        for lay in self.layers:
            lay.compact(moves, len(order), trim)
        self.mask = self.mask.index_select(0, torch.tensor(order, device=self.device))[:, trim:]


def _fill_from_the_end(keep: list[int], n: int) -> tuple[list[int], list[tuple[int, int]]]:
    """When rows leave a batch of ``n``, the kept rows (``keep``, ascending) go into the first
    ``len(keep)`` slots by moving only those beyond that into the slots the leavers freed: the new
    order (old row per slot) and the moves ``(slot, old row)``. Copying every kept row instead (an
    index_select of each layer's buffer) cost a whole cache copy each time a row stopped."""
    k, kept = len(keep), set(keep)
    free = [b for b in range(k) if b not in kept]
    movers = [b for b in keep if b >= k]
    order = list(range(k))
    for slot, row in zip(free, movers):
        order[slot] = row
    return order, list(zip(free, movers))


#: Tokens per block of ``_inverse_cdf``'s first level.
CDF_BLOCK = 256


def _inverse_cdf(probs: torch.Tensor, gen: torch.Generator, block: int = CDF_BLOCK) -> torch.Tensor:
    """One draw per row from ``probs`` (rows need not sum to 1) with one uniform number per row:
    the first token whose cumulative mass exceeds it. ``torch.multinomial`` draws an exponential
    for every vocabulary entry instead, 8 % of a batch-32 decoding step at a 49 k vocabulary; a
    token with zero mass (cut by top-p) is never chosen, since its cumulative mass equals its
    predecessor's. The search has two levels, in float64: the block of ``block`` tokens (from the
    blocks' cumulative masses), then the token inside that block; a float64 cumulative sum over the
    whole vocabulary was 7 ms of a ~300 ms batch-32 step. The draw is the one-level search's up to
    the last bit of the summation order."""
    return _search(probs, torch.rand((probs.shape[0], 1), generator=gen, dtype=torch.float64), block)


def _search(probs: torch.Tensor, uniform: torch.Tensor, block: int) -> torch.Tensor:
    """``_inverse_cdf`` given the uniforms ``[rows, 1]`` in [0, 1)."""
    p = probs.detach().cpu()
    rows, vocab = p.shape
    if vocab % block:
        p = torch.nn.functional.pad(p, (0, block - vocab % block))
    blocks = p.view(rows, -1, block)
    cdf = blocks.sum(-1, dtype=torch.float64).cumsum(-1)  # [rows, blocks]
    u = uniform * cdf[:, -1:]
    k = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[1] - 1)  # cdf[k - 1] <= u < cdf[k]
    before = torch.where(k > 0, cdf.gather(1, (k - 1).clamp(min=0)), torch.zeros_like(u))
    inside = blocks.gather(1, k.unsqueeze(-1).expand(rows, 1, block)).squeeze(1).double().cumsum(-1)
    # the block's own running sum may end a rounding below its mass as counted above: stay inside it,
    # so that the draw is the block's last token with mass, never a zero-mass one after it
    rest = torch.minimum(u - before, torch.nextafter(inside[:, -1:], torch.zeros_like(u)))
    return (k * block + torch.searchsorted(inside, rest, right=True)).squeeze(-1).clamp_(max=vocab - 1)


def _dedupe_rows(rows: list[tuple[RowCache | None, list[int]]]) -> tuple[
        list[tuple[RowCache | None, list[int]]], list[int]]:
    """Rows that continue the same cache (the same object, or none) with the same tokens are encoded
    once: a group's first prompt, or a group continuing one saved state. The distinct rows, and
    for each input row the index of its distinct row; the rows of one distinct row then share its
    cache object, which is what lets them decode against one copy of it (``shared_prompt``)."""
    first: dict[tuple[int, tuple[int, ...]], int] = {}
    which: list[int] = []
    unique: list[tuple[RowCache | None, list[int]]] = []
    for row, new in rows:
        key = (id(row), tuple(new))  # id(None) for every row without a cache
        if key not in first:
            first[key] = len(unique)
            unique.append((row, new))
        which.append(first[key])
    return unique, which
