"""The key/value stores the cached sampler keeps: one episode's cache (``RowCache``) and a batch
cache layer with room to grow (``buffer_layer_class``). Their own module because both decoding
layouts use them: the padded batch (``generation``) and the shared-prompt batch (``shared_prompt``)."""

from __future__ import annotations

from typing import Any

import torch

Layers = list[tuple[torch.Tensor, torch.Tensor]]


class RowCache:
    """One episode's keys and values for its first ``n`` tokens.

    A row that continued a prompt cache shared with other rows (``joined_later``) keeps that cache
    and its own tokens after it apart until its layers are first read: a single-turn episode's cache
    is never read again, and copying the prompt into each of 32 leaving rows was ~2 % of a batch-32
    decoding turn (and held 32 copies of the prompt's cache)."""

    def __init__(self, layers: Layers, n: int):
        self._layers: Layers | None = layers
        self.n = n
        self._parts: tuple[RowCache, Layers] | None = None

    @classmethod
    def joined_later(cls, prefix: RowCache, own: Layers, n: int) -> RowCache:
        """``prefix``'s tokens then ``own`` (per layer, tensors this row owns), ``n`` in all."""
        row = cls([], n)
        row._layers, row._parts = None, (prefix, own)
        return row

    @property
    def n_layers(self) -> int:
        return len(self._layers) if self._layers is not None else len(self._parts[1])  # type: ignore[index]

    def pieces(self, layer: int) -> Layers:
        """Layer ``layer``'s (keys, values) as the consecutive pieces they are kept in: one, or the
        prompt's then the row's own, so that a reader copying them into a batch need not join them
        first (a second turn's prefill copies every row's cache into one buffer)."""
        if self._layers is not None:
            return [self._layers[layer]]
        assert self._parts is not None
        prefix, own = self._parts
        return [*prefix.pieces(layer), own[layer]]

    @property
    def layers(self) -> Layers:
        if self._layers is None:
            joined = []
            for li in range(self.n_layers):
                ks, vs = zip(*self.pieces(li))
                joined.append((torch.cat(ks, 2), torch.cat(vs, 2)))
            self._layers, self._parts = joined, None
        return self._layers


def buffer_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class BufferLayer(DynamicLayer):
        """A cache layer that writes new keys/values into preallocated room instead of concatenating
        (which copies the whole cache at every decoding step)."""

        def __init__(self, k: torch.Tensor, v: torch.Tensor, n: int):
            super().__init__()
            self._k, self._v, self.n = k, v, n
            self.device, self.is_initialized = k.device, True
            self._views()

        def _views(self) -> None:
            self.keys, self.values = self._k[:, :, :self.n], self._v[:, :, :self.n]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            m = key_states.shape[-2]
            if self.n + m > self._k.shape[-2]:  # out of room: grow (doubling)
                cap = max(2 * self._k.shape[-2], self.n + m)
                k = self._k.new_zeros((*self._k.shape[:2], cap, self._k.shape[-1]))
                v = self._v.new_zeros((*self._v.shape[:2], cap, self._v.shape[-1]))
                k[:, :, :self.n], v[:, :, :self.n] = self.keys, self.values
                self._k, self._v = k, v
            self._k[:, :, self.n:self.n + m] = key_states
            self._v[:, :, self.n:self.n + m] = value_states
            self.n += m
            self._views()
            return self.keys, self.values

        def compact(self, moves: list[tuple[int, int]], rows: int, trim: int) -> None:
            """Keep the first ``rows`` rows after copying row ``src`` into slot ``dst`` for each
            ``(dst, src)`` of ``moves``, and drop ``trim`` leading positions (padding all of them
            have). Only the moved rows are copied: the rest is a view of the same buffer."""
            for dst, src in moves:
                self._k[dst] = self._k[src]
                self._v[dst] = self._v[src]
            self._k, self._v = self._k[:rows, :, trim:], self._v[:rows, :, trim:]
            self.n -= trim
            self._views()

    return BufferLayer
