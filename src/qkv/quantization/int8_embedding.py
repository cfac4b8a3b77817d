"""The token embedding W_E read from an int8 matrix, for models whose unembedding is tied to it (W_U = W_E^T).

Weight-only int8 (:mod:`qkv.quantization.int8_linear`) quantizes W_U per output channel, and W_U's output channels
are W_E's rows: one scale per vocabulary entry. When the two are tied, the int8 matrix and its scales serve
both: the unembedding multiplies by it, and the embedding looks a token's row up and dequantizes it,

    E(token) = s_token * Q[token]   (times sqrt(d_model) if the model scales its embeddings),

so the tie survives quantization and the largest matrix of a GPT is stored once, in a quarter of its float32
bytes. A grouped W_U (``group_size`` g, GGUF's Q8_0 for g = 32) has a scale per g weights of each row, and the
lookup multiplies each group of the row by its own: E(token)_j = s_token,j//g Q[token, j]. The price is that
an input vector is the quantized row (error at most half a scale per coordinate) rather than the exact one.
An untied embedding is a lookup that reads a few rows per step, so quantizing it saves memory but no time: it
stays in floating point.
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
        self.weight_scale = unembedding.weight_scale  # (vocab_size,), or (vocab_size, d_model / g) in groups of g
        self.group_size = unembedding.group_size
        self.scale = scale  # sqrt(d_model) for the paper's scaled embeddings, else 1
        self.num_embeddings, self.embedding_dim = self.qweight.shape

    @property
    def weight(self) -> Tensor:
        """The dequantized embedding matrix (vocab_size, d_model), a new tensor on every access."""
        return dequantize(self.qweight, self.weight_scale)

    def forward(self, token_ids: Tensor) -> Tensor:
        rows = F.embedding(token_ids, self.qweight).to(self.weight_scale.dtype)  # (B, T) -> (B, T, d_model)
        if self.group_size:  # each group of g values times its own scale
            scales = F.embedding(token_ids, self.weight_scale)  # (B, T, d_model / g)
            groups = rows.unflatten(-1, (scales.shape[-1], self.group_size))  # (B, T, d_model / g, g)
            vectors = (groups * scales[..., None]).flatten(-2)  # (B, T, d_model)
        else:
            vectors = rows * F.embedding(token_ids, self.weight_scale[:, None])  # each row times its token's scale
        return vectors * self.scale if self.scale != 1.0 else vectors

    def extra_repr(self) -> str:
        groups = f" in groups of {self.group_size}" if self.group_size else ""
        return f"{self.num_embeddings}, {self.embedding_dim}, int8{groups}, tied to the unembedding"
