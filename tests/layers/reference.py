"""Helpers that copy qkv weights into PyTorch's reference modules, for parity tests."""

from __future__ import annotations

import torch
from torch import nn

from qkv.layers.attention import MultiHeadAttention


@torch.no_grad()
def copy_attention(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    """Make ``ref`` compute exactly what ``ours`` computes (W_q, W_k, W_v stacked into in_proj)."""
    ref.in_proj_weight.copy_(torch.cat([ours.query.weight, ours.key.weight, ours.value.weight]))
    if ref.in_proj_bias is not None:
        ref.in_proj_bias.copy_(torch.cat([ours.query.bias, ours.key.bias, ours.value.bias]))
    ref.out_proj.weight.copy_(ours.out_proj.weight)
    if ref.out_proj.bias is not None:
        ref.out_proj.bias.copy_(ours.out_proj.bias)
