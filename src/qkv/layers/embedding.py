"""Token embedding W_E and unembedding W_U.

The GPT notes: every token id picks one row of the embedding matrix W_E, a vector that encodes the token's
meaning (similar tokens land near each other; E(king) - E(man) + E(woman) lands near E(queen)). At the
other end, the unembedding W_U maps the last vector to one score (logit) per vocabulary entry, which the
softmax turns into the next-token distribution. GPT-2 and the paper tie the two: W_U = W_E^T.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from qkv.layers.capture import record
from qkv.layers.dropout import dropout_layer
from qkv.layers.linear import linear


class TokenEmbedding(nn.Embedding):
    """Rows of W_E for each token id, optionally multiplied by sqrt(d_model) (the paper, section 3.4)."""

    def __init__(self, vocab_size: int, d_model: int, *, scale: bool = False, padding_idx: int | None = None):
        super().__init__(vocab_size, d_model, padding_idx=padding_idx)
        self.scale = math.sqrt(d_model) if scale else 1.0

    def forward(self, token_ids: Tensor) -> Tensor:
        vectors = super().forward(token_ids)  # (B, T) -> (B, T, d_model)
        return vectors * self.scale if self.scale != 1.0 else vectors


class Unembedding(nn.Module):
    """logits = x W_U (+ b): one score per vocabulary entry for every position."""

    def __init__(self, d_model: int, vocab_size: int, *, tied_to: nn.Embedding | None = None, bias: bool = False):
        super().__init__()
        self.weight = tied_to.weight if tied_to is not None else nn.Parameter(torch.empty(vocab_size, d_model))
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None
        self.tied = tied_to is not None

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)  # (..., d_model) -> (..., vocab_size)


class InputEmbedding(nn.Module):
    """Token ids -> W_E rows (times sqrt(d_model) if asked) + positional encoding, then dropout.

    ``positional`` is "sinusoidal" or "learned" (added here) or "rope"/"none" (nothing added; rotary
    positions are applied inside attention).
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        max_len: int,
        *,
        positional: str = "learned",
        scale: bool = False,
        dropout: float = 0.0,
        sinusoidal_interleaved: bool = True,
        token_embedding: TokenEmbedding | None = None,
    ) -> None:
        super().__init__()
        from qkv.layers.positional import LearnedPositionalEncoding, SinusoidalPositionalEncoding

        self.token_embedding = token_embedding or TokenEmbedding(vocab_size, d_model, scale=scale)
        self.positional_encoding: nn.Module | None = None
        if positional == "sinusoidal":
            self.positional_encoding = SinusoidalPositionalEncoding(
                max_len, d_model, interleaved=sinusoidal_interleaved
            )
        elif positional == "learned":
            self.positional_encoding = LearnedPositionalEncoding(max_len, d_model)
        self.dropout = dropout_layer(dropout)

    def forward(self, token_ids: Tensor, start: int = 0) -> Tensor:
        x = record(self, "tokens", self.token_embedding(token_ids))  # (B, T, d_model)
        if self.positional_encoding is not None:
            positions = self.positional_encoding(token_ids.shape[1], start)  # (T, d_model), broadcast over B
            x = x + record(self, "positions", positions)
        return self.dropout(record(self, "output", x))
