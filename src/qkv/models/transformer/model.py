"""The paper's encoder-decoder Transformer (the notes on the mathematics of attention, the encoder-decoder study
notes, the notes on Attention Is All You Need).

The encoder reads the whole source sentence (e.g. English) with self-attention. The decoder writes the
target (e.g. French) one token at a time, starting from ``<bos>``: masked self-attention over what it has
written so far, then cross-attention whose queries come from the decoder and whose keys and values come
from the encoder output ("memory"), then the FFN. The unembedding turns the last decoder vector into a
distribution over the next target token. In training the whole shifted target is fed at once (teacher
forcing); the causal mask keeps each position from seeing its answer.
"""

from __future__ import annotations

from typing import Any, cast

from torch import Tensor

from qkv.layers.blocks import BlockConfig
from qkv.layers.capture import record
from qkv.layers.embedding import InputEmbedding, Unembedding
from qkv.layers.kv_cache import KVCache
from qkv.layers.stacks import DecoderStack, EncoderStack
from qkv.models.base import EncoderDecoder
from qkv.models.init import init_weights
from qkv.models.transformer.config import TransformerConfig


class Transformer(EncoderDecoder):
    """Encoder-decoder model built from a :class:`TransformerConfig`."""

    config: TransformerConfig

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config)
        common: dict[str, Any] = dict(
            positional=config.positional,
            scale=config.scale_embeddings,
            dropout=config.dropout,
            sinusoidal_interleaved=config.sinusoidal_interleaved,
        )
        self.src_embedding = InputEmbedding(config.src_vocab_size, config.d_model, config.context_length, **common)
        shared = self.src_embedding.token_embedding if config.share_embeddings else None
        self.tgt_embedding = InputEmbedding(
            config.tgt_vocab_size, config.d_model, config.context_length, token_embedding=shared, **common
        )
        blocks = cast(BlockConfig, config)  # __post_init__ filled its None defaults
        self.encoder = EncoderStack(blocks, config.n_encoder_layers)
        self.decoder = DecoderStack(blocks, config.n_decoder_layers, cross_attention=True)
        tied = self.tgt_embedding.token_embedding if config.tie_embeddings else None
        self.unembedding = Unembedding(
            config.d_model, config.tgt_vocab_size, tied_to=tied, bias=config.final_logits_bias
        )
        init_weights(self, config, config.n_encoder_layers + config.n_decoder_layers)

    def encode(self, src_ids: Tensor, *, src_padding_mask: Tensor | None = None) -> Tensor:
        """Encoder output ("memory") (B, S, d_model) for source ids (B, S)."""
        self.check_length(src_ids.shape[1], "source")
        x = self.src_embedding(src_ids)
        rotary = self.rotary_angles(src_ids.shape[1])
        memory = self.encoder(x, key_padding_mask=src_padding_mask, rotary=rotary)
        return record(self, "memory", memory)

    def decode(
        self,
        tgt_ids: Tensor,
        memory: Tensor,
        *,
        memory_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
        cache: KVCache | None = None,
        last_only: bool = False,
    ) -> Tensor:
        """Next-token logits (B, T, tgt_vocab_size) for target ids (B, T) given the encoder output.

        With a ``cache``, ``tgt_ids`` are the new tokens only and the encoder's keys/values are reused.
        """
        start = cache.length if cache is not None else 0
        self.check_length(start + tgt_ids.shape[1], "target")
        x = self.tgt_embedding(tgt_ids, start)
        rotary = self.rotary_angles(tgt_ids.shape[1], start)
        x = self.decoder(
            x,
            memory,
            key_padding_mask=tgt_padding_mask,
            memory_padding_mask=memory_padding_mask,
            cache=cache,
            rotary=rotary,
        )
        if last_only:
            x = x[:, -1:]
        return record(self, "logits", self.unembedding(x))

    def new_cache(self, max_len: int | None = None) -> KVCache:
        return self.decoder.new_cache(max_len or self.config.context_length)
