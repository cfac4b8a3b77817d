"""The norm a config asks for: LayerNorm (the paper, GPT-2, BERT) or RMSNorm (Llama, Qwen2, SmolLM).

LayerNorm centres and scales each token vector, then applies a gain g and a bias b:

    LayerNorm(x) = (x - mean(x)) / sqrt(var(x) + eps) * g + b

RMSNorm (Zhang and Sennrich 2019, "Root Mean Square Layer Normalization") drops the centring and the bias,
keeping only the rescaling, which costs less and trains as well:

    RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g

Both are PyTorch's own modules (``nn.LayerNorm``, ``nn.RMSNorm``), so the parameter is ``weight`` (g) in
either case, and ``bias`` (b) only for a LayerNorm with ``config.bias``.
"""

from __future__ import annotations

from typing import Protocol

from torch import nn


class NormConfig(Protocol):
    d_model: int
    norm: str  # "layernorm" or "rmsnorm"
    layer_norm_eps: float
    bias: bool


def make_norm(config: NormConfig) -> nn.Module:
    """``nn.LayerNorm`` or ``nn.RMSNorm`` over d_model, as ``config.norm`` says, with its eps (and bias)."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.d_model, eps=config.layer_norm_eps)
    if config.norm == "layernorm":
        return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps, bias=config.bias)
    raise ValueError(f"norm={config.norm!r} is unknown: use 'layernorm' or 'rmsnorm'")
