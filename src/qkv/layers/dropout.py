"""Dropout (Srivastava et al. 2014): during training, zero each activation with probability p and scale the
survivors by 1/(1-p); at evaluation time, do nothing. The paper applies it to every sublayer output, the
summed embeddings and (Raschka, ch. 3) the attention weights."""

from __future__ import annotations

from torch import nn


def dropout_layer(p: float) -> nn.Module:
    """``nn.Dropout(p)``, or a no-op module when p = 0 (saves a kernel call per use in small models)."""
    return nn.Dropout(p) if p > 0 else nn.Identity()
