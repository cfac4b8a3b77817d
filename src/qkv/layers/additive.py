"""Additive attention (Bahdanau et al. 2015, "RNNSearch"), the attention the Transformer replaced.

The notes on the mathematics of attention: "In the original RNNSearch paper, they use what's called 'Additive
Attention', where the attention values are computed from a learned feedforward neural network ... Here we use
'multiplicative' or dot-product attention." The feed-forward network is one tanh hidden layer scored by a
vector v:

    e_ij     = v^T tanh(W_q q_i + W_k k_j)          (score of query i against key j)
    alpha_ij = softmax_j(e_ij)                       (attention weights, each row sums to 1)
    c_i      = sum_j alpha_ij v_j                    (context vector: weighted sum of the values)

In RNNSearch q_i is the decoder state s_{i-1} and the keys and values are both the encoder states h_j.

How it differs from multiplicative (scaled dot-product) attention, e_ij = q_i . k_j / sqrt(d_k):

- the compatibility function is learned and non-linear, so queries and keys may have different sizes
  (d_q != d_k) and need no shared space;
- it cannot be written as one matrix product Q K^T: every (query, key) pair goes through the hidden
  layer, a (B, Tq, Tk, hidden) tensor, which is slower and uses more memory;
- tanh bounds each term, so scores cannot grow with the dimension and no 1/sqrt(d_k) is needed. The
  Transformer paper notes the two perform alike for small d_k, and that additive attention beats
  *unscaled* dot products for large d_k, which is why it scales them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from qkv.layers.attention import masked_softmax
from qkv.layers.capture import record


class AdditiveAttention(nn.Module):
    """e_ij = v^T tanh(W_query q_i + W_key k_j); weights = softmax_j(e_ij); context = weights @ values.

    ``W_query`` (query_dim -> hidden_dim), ``W_key`` (key_dim -> hidden_dim) and ``v`` (hidden_dim -> 1)
    are bias-free linear maps, as in the paper's equations.
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.W_query = nn.Linear(query_dim, hidden_dim, bias=False)  # W_a in Bahdanau et al.
        self.W_key = nn.Linear(key_dim, hidden_dim, bias=False)  # U_a
        self.v = nn.Linear(hidden_dim, 1, bias=False)  # v_a

    def project_keys(self, keys: Tensor) -> Tensor:
        """W_key k_j (B, Tk, hidden): it does not depend on the query, so a decoder that attends to the same
        keys at every step (RNNSearch) computes it once per sentence and passes it as ``projected_keys``."""
        return self.W_key(keys)

    def scores(self, queries: Tensor, keys: Tensor | None, *, projected_keys: Tensor | None = None) -> Tensor:
        """The unnormalised scores e (B, Tq, Tk) for queries (B, Tq, d_q) and keys (B, Tk, d_k)."""
        q = self.W_query(queries)[:, :, None, :]  # (B, Tq, 1, hidden)
        if projected_keys is None:
            assert keys is not None, "scores needs keys or projected_keys"
            projected_keys = self.project_keys(keys)
        k = projected_keys[:, None, :, :]  # (B, 1, Tk, hidden)
        return self.v(torch.tanh(q + k)).squeeze(-1)  # (B, Tq, Tk, hidden) -> (B, Tq, Tk)

    def forward(
        self,
        queries: Tensor,
        keys: Tensor | None,
        values: Tensor,
        key_padding_mask: Tensor | None = None,
        *,
        projected_keys: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Attend from queries (B, Tq, d_q) to keys (B, Tk, d_k) and values (B, Tk, d_v).

        ``key_padding_mask`` (B, Tk) is True where a key is padding; padding gets weight 0, and a query
        with only padding to attend to gets zero weights and a zero context (not NaN). With
        ``projected_keys`` (:meth:`project_keys` of the keys, computed earlier) ``keys`` is not read.
        Returns (context (B, Tq, d_v), weights (B, Tq, Tk)); the weights are recorded with a head axis,
        (B, 1, Tq, Tk), the shape every attention in qkv records, so the views read them alike.
        """
        scores = self.scores(queries, keys, projected_keys=projected_keys)  # (B, Tq, Tk)
        mask = None if key_padding_mask is None else ~key_padding_mask.bool()[:, None, :]  # (B, 1, Tk)
        weights = masked_softmax(scores, mask)  # (B, Tq, Tk)
        weights = record(self, "weights", weights[:, None])[:, 0]  # recorded as (B, 1, Tq, Tk): one head
        return weights @ values, weights  # (B, Tq, d_v), (B, Tq, Tk)
