"""Key/value cache for incremental decoding.

Generating token t+1 needs the queries of the new token only, but the keys and values of all earlier
tokens. Those do not change (a causal model never lets a token see its future), so they are computed once
and kept: the prompt is run through the model once (prefill) and every later step feeds one token,
appends its key and value and attends to the cache. For cross-attention the keys and values come from the
encoder output and are computed once per sentence (``static``).

Buffers are allocated once at full length; a step writes into them in place and attention reads a view,
so decoding does not re-allocate memory per token. :meth:`KVCache.allocate` makes the buffers of every
layer up front as one tensor, (n_layers, B, 2, h_kv, max_len, d_k) (keys at index 0 of the third axis,
values at 1; h_kv = n_kv_heads, the key/value heads, fewer than the query heads with grouped-query
attention): the static cache of :mod:`qkv.decoding.engine`, whose decode step has the same shapes at every
position, writes a token's key and value with one copy per layer, and follows beams (:meth:`reorder`)
without moving to new memory.
"""

from __future__ import annotations

import torch
from torch import Tensor


class LayerKVCache:
    """Keys and values of one attention layer: (B, h_kv, max_len, d_k) buffers filled up to ``length``."""

    def __init__(self, max_len: int, *, keys: Tensor | None = None, values: Tensor | None = None) -> None:
        self.max_len = max_len
        self.length = 0
        self.static = False
        self._keys, self._values = keys, values  # preallocated (B, h_kv, max_len, d_k) views, or made at first store

    @property
    def keys(self) -> Tensor:
        assert self._keys is not None, "empty cache"
        return self._keys[:, :, : self.length]

    @property
    def values(self) -> Tensor:
        assert self._values is not None, "empty cache"
        return self._values[:, :, : self.length]

    def reset(self) -> None:
        """Forget the stored positions (a fresh prefill follows), keeping the buffers: no new allocation."""
        self.length = 0

    def store(self, keys: Tensor, values: Tensor, *, static: bool = False) -> tuple[Tensor, Tensor]:
        """Append new keys/values (B, h_kv, T, d_k) (or, if ``static``, keep them whole) and return all so far."""
        if static:
            self._keys, self._values, self.length, self.static = keys, values, keys.shape[2], True
            return keys, values
        new = keys.shape[2]
        if self._keys is None:
            batch, heads, _, dim = keys.shape
            self._keys = keys.new_empty(batch, heads, self.max_len, dim)
            self._values = values.new_empty(batch, heads, self.max_len, values.shape[-1])
        if self.length + new > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; {self.length} + {new} do not fit")
        self._keys[:, :, self.length : self.length + new] = keys
        self._values[:, :, self.length : self.length + new] = values  # type: ignore[index]
        self.length += new
        return self.keys, self.values

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search: follow each surviving hypothesis's history).

        With as many rows as before, the filled positions are rewritten in place (the buffers stay where
        they are); otherwise the rows are gathered into new buffers.
        """
        if self._keys is None:
            return
        if self.static or index.numel() != self._keys.shape[0]:
            self._keys = self._keys.index_select(0, index)
            self._values = self._values.index_select(0, index)  # type: ignore[union-attr]
            return
        n = self.length
        self._keys[:, :, :n] = self._keys[:, :, :n].index_select(0, index)
        self._values[:, :, :n] = self._values[:, :, :n].index_select(0, index)  # type: ignore[index]


class KVCache:
    """The caches of a whole model: one per layer for self-attention, one per layer for cross-attention."""

    def __init__(self, n_layers: int, max_len: int, *, cross_attention: bool = False) -> None:
        self.max_len = max_len
        self.self_attention = [LayerKVCache(max_len) for _ in range(n_layers)]
        self.cross_attention = [LayerKVCache(max_len) for _ in range(n_layers)] if cross_attention else None
        self.buffer: Tensor | None = None  # (n_layers, B, 2, h_kv, max_len, d_k) once allocated

    @property
    def length(self) -> int:
        """Number of positions already processed (the absolute position of the next token)."""
        return self.self_attention[0].length

    @length.setter
    def length(self, value: int) -> None:
        for cache in self.self_attention:
            cache.length = value

    def allocate(
        self, batch: int, n_kv_heads: int, head_dim: int, *, dtype: torch.dtype, device: torch.device
    ) -> Tensor:
        """Make every self-attention buffer now, as one zero-filled (n_layers, B, 2, h_kv, max_len, d_k)
        tensor: ``n_kv_heads`` key/value heads (the config's ``n_kv_heads``, not ``n_heads``).

        Zeros, not garbage: a decode step that attends over the whole buffer masks the unfilled positions,
        and a NaN there would survive the mask (NaN * 0 is NaN).
        """
        shape = (len(self.self_attention), batch, 2, n_kv_heads, self.max_len, head_dim)
        return self.use(torch.zeros(shape, dtype=dtype, device=device)).buffer  # type: ignore[return-value]

    def use(self, buffer: Tensor) -> KVCache:
        """Point every self-attention layer at ``buffer`` (n_layers, B, 2, h_kv, max_len, d_k), emptied: views
        into it, no copy (the decoding engine gives each request a few rows of its pool this way)."""
        self.buffer = buffer
        for i, cache in enumerate(self.self_attention):
            cache._keys, cache._values = buffer[i, :, 0], buffer[i, :, 1]  # (B, h_kv, max_len, d_k) views
            cache.length = 0
        return self

    def reset(self) -> None:
        """Empty every self-attention cache for a fresh prefill, keeping the buffers (cross-attention keys
        and values, computed once per source, stay)."""
        for cache in self.self_attention:
            cache.reset()

    def layer(self, i: int) -> tuple[LayerKVCache, LayerKVCache | None]:
        return self.self_attention[i], (self.cross_attention[i] if self.cross_attention else None)

    def reorder(self, index: Tensor, *, cross_attention: bool = True) -> None:
        """Keep batch rows ``index`` in every layer. ``cross_attention=False`` leaves the encoder's keys and
        values alone (beam search, where the beams of one sentence share them)."""
        if self.buffer is not None and index.numel() == self.buffer.shape[1]:
            n = self.length
            for layer in self.buffer[..., :n, :]:  # (B, 2, h_kv, n, d_k): one layer at a time is 8x faster than
                layer.copy_(layer.index_select(0, index))  # one index_select over all the layers' strides
        else:
            for cache in self.self_attention:
                cache.reorder(index)
            self.buffer = None  # the layers now hold buffers of their own
        if cross_attention:
            for cache in self.cross_attention or []:
                cache.reorder(index)
