"""The optimizer: AdamW with weight decay on matrices only.

Decay pulls weights towards zero; it is meant for the matrices that mix features (W_q, W_k, W_v, W_o,
the FFN, the embeddings), not for biases and LayerNorm gains, whose scale carries meaning. The fused
AdamW kernel (one pass over all parameters instead of several small ops per tensor) is used where torch
has it (CPU and CUDA).
"""

from __future__ import annotations

import torch
from torch import nn


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: tensors with >= 2 dimensions decay, the rest do not. Shared (tied) tensors appear once."""
    decay, no_decay = [], []
    for parameter in model.parameters():  # parameters() yields a tied tensor once
        if parameter.requires_grad:
            (decay if parameter.dim() >= 2 else no_decay).append(parameter)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def make_optimizer(
    model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float], device_type: str
) -> torch.optim.AdamW:
    """AdamW over :func:`parameter_groups`, fused on CPU and CUDA."""
    fused = device_type in ("cpu", "cuda")
    return torch.optim.AdamW(parameter_groups(model, weight_decay), lr=lr, betas=betas, fused=fused)
