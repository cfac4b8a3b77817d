"""GPT: the decoder-only language model of the GPT notes.

token ids -> W_E rows + positions -> N causal blocks -> final LayerNorm -> W_U -> logits.
Each position's logits score every vocabulary entry as the next token; causal masking means position t
only uses tokens 0..t, so one sequence trains T next-token predictions at once, and at generation time
only the last position's logits matter ("the computation to predict the next token relies entirely on
the final vector", the GPT notes).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor

from qkv.layers.blocks import BlockConfig
from qkv.layers.capture import record
from qkv.layers.embedding import InputEmbedding, Unembedding
from qkv.layers.kv_cache import KVCache
from qkv.layers.stacks import DecoderStack
from qkv.models.base import Model
from qkv.models.gpt.config import GPTConfig
from qkv.models.init import init_weights


class GPT(Model):
    """Decoder-only Transformer language model built from a :class:`GPTConfig`. ``window``: each position
    attends to the last ``window`` positions only (a causal sliding window; None: the whole context)."""

    config: GPTConfig

    def __init__(self, config: GPTConfig, *, window: int | None = None) -> None:
        super().__init__(config)
        self.embedding = InputEmbedding(
            config.vocab_size,
            config.d_model,
            config.context_length,
            positional=config.positional,
            scale=config.scale_embeddings,
            dropout=config.dropout,
            sinusoidal_interleaved=config.sinusoidal_interleaved,
        )
        # cast: BaseConfig.__post_init__ filled the None defaults the blocks read (d_ff, n_kv_heads, ...)
        self.decoder = DecoderStack(cast(BlockConfig, config), config.n_layers, cross_attention=False, window=window)
        tied = self.embedding.token_embedding if config.tie_embeddings else None
        self.unembedding = Unembedding(config.d_model, config.vocab_size, tied_to=tied)
        init_weights(self, config, config.n_layers)

    def new_cache(self, max_len: int | None = None) -> KVCache:
        """An empty KV cache for generating up to ``max_len`` (default: context_length) positions."""
        return self.decoder.new_cache(max_len or self.config.context_length)

    def forward(
        self,
        token_ids: Tensor,
        *,
        cache: KVCache | None = None,
        key_padding_mask: Tensor | None = None,
        last_only: bool = False,
        at: Tensor | None = None,
        unembed: bool = True,
    ) -> Tensor:
        """Logits (B, T, vocab_size) for token ids (B, T); (B, 1, vocab_size) with ``last_only`` (the last
        position) or ``at`` (B,) (one position per row: a batch of right-padded prompts' last real tokens).
        ``unembed=False``: the final hidden states (B, T, d_model) instead, for a loss that applies W_U itself
        (:mod:`qkv.layers.linear_cross_entropy`).

        With a ``cache``, ``token_ids`` are the *new* tokens; their positions follow the cached ones.
        """
        length = token_ids.shape[1]
        start = cache.length if cache is not None else 0
        self.check_length(start + length, fix="crop the input from the left (generation does this for you)")
        x = self.embedding(token_ids, start)  # (B, T, d_model)
        rotary = self.rotary_angles(length, start)
        x = self.decoder(x, key_padding_mask=key_padding_mask, cache=cache, rotary=rotary)
        if at is not None:
            x = x[torch.arange(x.shape[0], device=x.device), at][:, None]  # (B, 1, d_model)
        elif last_only:
            x = x[:, -1:]
        if not unembed:
            return x  # (B, T, d_model)
        return record(self, "logits", self.unembedding(x))  # (B, T, vocab_size)
