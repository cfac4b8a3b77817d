"""Softmax with temperature: scores (logits) -> a probability distribution.

The GPT notes: softmax(x)_i = e^{x_i} / sum_j e^{x_j} makes any list of numbers positive and summing to 1
([2, 4, 5] -> [0.0351, 0.2595, 0.7054]). Dividing the logits by a temperature T first reshapes it:
T < 1 sharpens it towards the argmax (T -> 0 is greedy), T > 1 flattens it towards uniform (more varied
text). Subtracting the maximum before exponentiating keeps it finite for any logits.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _promote(logits: Tensor) -> Tensor:
    """Half-precision logits are promoted to float32; float32 and float64 keep their precision."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def softmax(logits: Tensor, temperature: float = 1.0, dim: int = -1) -> Tensor:
    """softmax(logits / T). T = 0 gives the limit: all mass on the maximum (split evenly between ties)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    logits = _promote(logits)
    if temperature == 0:
        is_max = logits == logits.amax(dim=dim, keepdim=True)
        return is_max.to(logits.dtype) / is_max.sum(dim=dim, keepdim=True)
    scaled = logits / temperature
    scaled = scaled - scaled.amax(dim=dim, keepdim=True)  # the largest term becomes e^0 = 1: no overflow
    exp = scaled.exp()
    return exp / exp.sum(dim=dim, keepdim=True)


def log_softmax(logits: Tensor, temperature: float = 1.0, dim: int = -1) -> Tensor:
    """log softmax(logits / T), computed stably (log-sum-exp), for T > 0."""
    if temperature <= 0:
        raise ValueError(f"log_softmax needs temperature > 0, got {temperature}")
    scaled = _promote(logits) / temperature
    return scaled - torch.logsumexp(scaled, dim=dim, keepdim=True)
