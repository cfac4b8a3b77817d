"""The norm a config asks for: LayerNorm (the paper, GPT-2, BERT) or RMSNorm (Llama, Qwen2, SmolLM).

LayerNorm centres and scales each token vector, then applies a gain g and a bias b:

    LayerNorm(x) = (x - mean(x)) / sqrt(var(x) + eps) * g + b

RMSNorm (Zhang and Sennrich 2019, "Root Mean Square Layer Normalization") drops the centring and the bias,
keeping only the rescaling, which costs less and trains as well:

    RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g

Both are PyTorch's modules (``nn.LayerNorm``, and :class:`RMSNorm`, an ``nn.RMSNorm``), so the parameter is
``weight`` (g) in either case, and ``bias`` (b) only for a LayerNorm with ``config.bias``. Where a gradient is
wanted, :class:`RMSNorm` takes its forward and backward passes from the C library (:mod:`qkv.native.rms_norm`: the
backward pass in one read of the rows instead of PyTorch's eight operators), when the library takes the tensors.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

from qkv.native import rms_norm as native_rms_norm


class NormConfig(Protocol):
    d_model: int
    norm: str  # "layernorm" or "rmsnorm"
    layer_norm_eps: float
    bias: bool


def make_norm(config: NormConfig) -> nn.Module:
    """``nn.LayerNorm`` or ``nn.RMSNorm`` over d_model, as ``config.norm`` says, with its eps (and bias)."""
    if config.norm == "rmsnorm":
        return RMSNorm(config.d_model, eps=config.layer_norm_eps)
    if config.norm == "layernorm":
        return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps, bias=config.bias)
    raise ValueError(f"norm={config.norm!r} is unknown: use 'layernorm' or 'rmsnorm'")


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` (same parameter, same state-dict names), whose training passes run in C where they can."""

    def forward(self, x: Tensor) -> Tensor:
        weight = self.weight
        wanted = x.requires_grad or (weight is not None and weight.requires_grad)
        if (
            torch.is_grad_enabled()
            and wanted
            and len(self.normalized_shape) == 1
            and native_rms_norm.applies(x, weight)
        ):
            eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
            return native_rms_norm.rms_norm(x, weight, eps)
        return super().forward(x)
