"""Keys and values of earlier positions as inputs and outputs of a graph: the KV cache of an exported model.

qkv's :class:`~qkv.layers.kv_cache.KVCache` keeps keys and values in buffers it writes in place. An ONNX
graph keeps no state between runs, so the cache goes in and comes out instead: each self-attention layer
takes the past keys and values (B, h, P, d_k) of the P positions already read and returns the present ones
(B, h, P + T, d_k), its past with the T new positions appended. The caller feeds the presents of one step as
the pasts of the next; P = 0 (empty tensors) reads a whole prompt. Cross-attention keys and values (the
encoder-decoder's) are computed once per source sentence and passed in unchanged at every step (static).

These classes speak the cache protocol the attention layers and models already use (``length``,
``layer(i)``, ``store``, ``keys``, ``values``, ``static``), so the models run their own forward pass on them.
"""

from __future__ import annotations

import torch
from torch import Tensor


class PastLayer:
    """One self-attention layer's past keys and values; :meth:`store` appends the new ones (``present``)."""

    static = False

    def __init__(self, keys: Tensor, values: Tensor) -> None:
        self.past_keys, self.past_values = keys, values
        self.present: tuple[Tensor, Tensor] | None = None

    @property
    def length(self) -> int:
        return self.past_keys.shape[2]

    def store(self, keys: Tensor, values: Tensor, *, static: bool = False) -> tuple[Tensor, Tensor]:
        """[past; new] along the positions: (B, h, P, d_k) + (B, h, T, d_k) -> (B, h, P + T, d_k) each."""
        self.present = (torch.cat([self.past_keys, keys], dim=2), torch.cat([self.past_values, values], dim=2))
        return self.present


class CrossLayer:
    """One cross-attention layer's keys and values of the encoder output (B, h, S, d_k), given whole."""

    static = True

    def __init__(self, keys: Tensor, values: Tensor) -> None:
        self.keys, self.values = keys, values


class PastKeyValues:
    """The caches of every layer, built from graph inputs; ``presents()`` are the graph's cache outputs."""

    def __init__(self, past: list[tuple[Tensor, Tensor]], cross: list[tuple[Tensor, Tensor]] | None = None) -> None:
        self.self_attention = [PastLayer(k, v) for k, v in past]
        self.cross_attention = [CrossLayer(k, v) for k, v in cross] if cross is not None else None

    @property
    def length(self) -> int:
        """Positions already read (P): the position of the first new token."""
        return self.self_attention[0].length

    def layer(self, i: int) -> tuple[PastLayer, CrossLayer | None]:
        return self.self_attention[i], (self.cross_attention[i] if self.cross_attention else None)

    def presents(self) -> list[Tensor]:
        """present keys and values, layer by layer: [k_0, v_0, k_1, v_1, ...]."""
        out: list[Tensor] = []
        for layer in self.self_attention:
            assert layer.present is not None, "the model did not run every layer"
            out.extend(layer.present)
        return out
