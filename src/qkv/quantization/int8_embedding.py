"""The token embedding W_E read from an int8 matrix, for models whose unembedding is tied to it (W_U = W_E^T).

Weight-only int8 (:mod:`qkv.quantization.int8_linear`) quantizes W_U per output channel, and W_U's output channels
are W_E's rows: one scale per vocabulary entry. When the two are tied, the int8 matrix and its scales serve
both: the unembedding multiplies by it, and the embedding looks a token's row up and dequantizes it,

    E(token) = s_token * Q[token]   (times sqrt(d_model) if the model scales its embeddings),

so the tie survives quantization and the largest matrix of a GPT is stored once, in a quarter of its float32
bytes. The price is that an input vector is the quantized row (error at most s_token / 2 per coordinate)
rather than the exact one. An untied embedding is a lookup that reads a few rows per step, so quantizing it
saves memory but no time: it stays in floating point.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from qkv.quantization.int8_linear import Int8Linear, dequantize


class Int8TokenEmbedding(nn.Module):
    """Rows of an int8 W_E shared with an :class:`Int8Linear` unembedding, dequantized per token."""

    def __init__(self, unembedding: Int8Linear, *, scale: float = 1.0) -> None:
        super().__init__()
        self.qweight = unembedding.qweight  # (vocab_size, d_model): the same parameters, not copies
        self.weight_scale = unembedding.weight_scale  # (vocab_size,)
        self.scale = scale  # sqrt(d_model) for the paper's scaled embeddings, else 1
        self.num_embeddings, self.embedding_dim = self.qweight.shape

    @property
    def weight(self) -> Tensor:
        """The dequantized embedding matrix (vocab_size, d_model), a new tensor on every access."""
        return dequantize(self.qweight, self.weight_scale)

    def forward(self, token_ids: Tensor) -> Tensor:
        rows = F.embedding(token_ids, self.qweight).to(self.weight_scale.dtype)  # (B, T) -> (B, T, d_model)
        vectors = rows * F.embedding(token_ids, self.weight_scale[:, None])  # each row times its token's scale
        return vectors * self.scale if self.scale != 1.0 else vectors

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8, tied to the unembedding"
