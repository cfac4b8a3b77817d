"""Maxout (Goodfellow et al. 2013): a learned piecewise-linear activation, RNNSearch's deep output layer.

A linear map makes ``pool`` candidate values per output unit, and the unit keeps the largest:

    t_k = max_j  t~_{k, j},    t~ = W x + b  with  pool * d_out  entries

Bahdanau et al. (2015, appendix A.2.2) use it between the decoder and the softmax, with pools of 2 (their
t~_i has 2l entries and t_i has l = 500). A maxout unit can represent ReLU (max(a, 0)), the absolute value
and any convex piecewise-linear function of two pieces.
"""

from __future__ import annotations

from torch import Tensor, nn


class Maxout(nn.Module):
    """(..., d_in) -> (..., d_out): a linear map to d_out * pool values, then the max of each pool."""

    def __init__(self, d_in: int, d_out: int, pool: int = 2) -> None:
        super().__init__()
        self.d_out, self.pool = d_out, pool
        self.linear = nn.Linear(d_in, d_out * pool)

    def forward(self, x: Tensor) -> Tensor:
        candidates = self.linear(x)  # (..., d_out * pool)
        return candidates.unflatten(-1, (self.d_out, self.pool)).amax(dim=-1)  # (..., d_out, pool) -> (..., d_out)
