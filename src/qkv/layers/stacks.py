"""N blocks in a row: the encoder stack and the decoder stack (the paper's "N x" boxes).

A stack works on vectors, not token ids: embeddings go in, refined vectors come out. The models in
:mod:`qkv.models` put embeddings in front and the unembedding behind.
"""

from __future__ import annotations

from torch import Tensor, nn

from qkv.layers.blocks import BlockConfig, DecoderBlock, EncoderBlock
from qkv.layers.kv_cache import KVCache
from qkv.layers.norm import make_norm


def _final_norm(config: BlockConfig) -> nn.Module:
    return make_norm(config) if config.final_norm else nn.Identity()


class EncoderStack(nn.Module):
    """N encoder blocks (bidirectional self-attention + FFN), then an optional final norm."""

    def __init__(self, config: BlockConfig, n_layers: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(EncoderBlock(config) for _ in range(n_layers))
        self.final_norm = _final_norm(config)

    def forward(
        self,
        x: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        for block in self.blocks:
            x = block(x, key_padding_mask=key_padding_mask, rotary=rotary)
        return self.final_norm(x)


class DecoderStack(nn.Module):
    """N decoder blocks (masked self-attention [+ cross-attention] + FFN), then an optional final norm.
    ``window``: every block's self-attention slides a causal window of that many positions."""

    def __init__(
        self, config: BlockConfig, n_layers: int, *, cross_attention: bool = True, window: int | None = None
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            DecoderBlock(config, cross_attention=cross_attention, window=window) for _ in range(n_layers)
        )
        self.final_norm = _final_norm(config)
        self.cross_attention = cross_attention

    def new_cache(self, max_len: int) -> KVCache:
        """An empty key/value cache for incremental decoding of up to ``max_len`` positions."""
        return KVCache(len(self.blocks), max_len, cross_attention=self.cross_attention)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        memory_padding_mask: Tensor | None = None,
        cache: KVCache | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        for i, block in enumerate(self.blocks):
            x = block(
                x,
                memory,
                key_padding_mask=key_padding_mask,
                memory_padding_mask=memory_padding_mask,
                cache=cache.layer(i) if cache is not None else None,
                rotary=rotary,
            )
        return self.final_norm(x)
