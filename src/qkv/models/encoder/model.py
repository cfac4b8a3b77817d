"""Encoder-only Transformer (the BERT family): every token attends to every other token, both ways.

token ids -> W_E rows + positions (+ segment embeddings, LayerNorm for BERT) -> N encoder blocks ->
one contextual vector per token. Mean-pooling those vectors over the real (non-padding) tokens gives a
sentence embedding (sentence-transformers' all-MiniLM-L6-v2 does exactly that).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from qkv.layers.blocks import BlockConfig
from qkv.layers.capture import record
from qkv.layers.dropout import dropout_layer
from qkv.layers.embedding import InputEmbedding
from qkv.layers.stacks import EncoderStack
from qkv.models.base import Model
from qkv.models.encoder.config import EncoderConfig
from qkv.models.init import init_weights


def mean_pool(hidden: Tensor, padding_mask: Tensor | None = None) -> Tensor:
    """Average token vectors (B, T, d) over the positions that are not padding -> (B, d)."""
    if padding_mask is None:
        return hidden.mean(dim=1)
    keep = (~padding_mask.bool()).unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return (hidden * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1e-9)


class Encoder(Model):
    """Bidirectional encoder built from an :class:`EncoderConfig`."""

    config: EncoderConfig

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        self.embedding = InputEmbedding(
            config.vocab_size,
            config.d_model,
            config.context_length,
            positional=config.positional,
            scale=config.scale_embeddings,
            sinusoidal_interleaved=config.sinusoidal_interleaved,
        )
        self.token_type_embedding = (
            nn.Embedding(config.type_vocab_size, config.d_model) if config.type_vocab_size else None
        )
        self.embedding_norm = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps, bias=config.bias) if config.embedding_norm else None
        )
        self.dropout = dropout_layer(config.dropout)
        blocks = cast(BlockConfig, config)  # __post_init__ filled its None defaults
        self.encoder = EncoderStack(blocks, config.n_layers)
        init_weights(self, config, config.n_layers)

    def forward(
        self,
        token_ids: Tensor,
        *,
        padding_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """Contextual vectors (B, T, d_model); ``padding_mask`` (B, T) is True at padding positions."""
        length = token_ids.shape[1]
        self.check_length(length, fix="shorten the input")
        x = self.embedding(token_ids)
        if self.token_type_embedding is not None:
            types = token_type_ids if token_type_ids is not None else torch.zeros_like(token_ids)
            x = x + self.token_type_embedding(types)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        x = self.dropout(x)
        rotary = self.rotary_angles(length)
        hidden = self.encoder(x, key_padding_mask=padding_mask, rotary=rotary)
        return record(self, "hidden", hidden)

    def embed(self, token_ids: Tensor, *, padding_mask: Tensor | None = None) -> Tensor:
        """Sentence embeddings (B, d_model): mean of the token vectors over non-padding positions."""
        return mean_pool(self(token_ids, padding_mask=padding_mask), padding_mask)
