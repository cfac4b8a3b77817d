"""Weight initialisation.

GPT-2 style (pre-LN models): every matrix ~ N(0, 0.02^2) (the gated feed-forward's W_g as its W_1), biases 0,
LayerNorm and RMSNorm gains 1, and the two projections that write into the residual stream (W_o and W_2) scaled
down by 1/sqrt(2N) so the sum of N blocks' contributions keeps unit scale. Paper style (post-LN models):
Xavier-uniform matrices, as in ``nn.Transformer`` and the Annotated Transformer, and N(0, d_model^-1/2)
embeddings when they are scaled by sqrt(d_model).
"""

from __future__ import annotations

import math

from torch import nn

from qkv.layers.attention import MultiHeadAttention
from qkv.layers.embedding import Unembedding
from qkv.layers.feedforward import FeedForward, GatedFeedForward
from qkv.layers.positional import LearnedPositionalEncoding
from qkv.models.config import BaseConfig


def init_weights(model: nn.Module, config: BaseConfig, n_layers: int) -> None:
    """Initialise ``model`` in place according to ``config`` (see the module docstring)."""
    std = config.init_std
    residual_std = std / math.sqrt(2 * n_layers)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            if config.norm_first:
                nn.init.normal_(module.weight, 0.0, std)
            else:
                nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            emb_std = config.d_model**-0.5 if config.scale_embeddings else std
            nn.init.normal_(module.weight, 0.0, emb_std)
        elif isinstance(module, Unembedding):
            if not module.tied:
                nn.init.normal_(module.weight, 0.0, config.d_model**-0.5 if not config.norm_first else std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, LearnedPositionalEncoding):
            nn.init.normal_(module.weight, 0.0, std)
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            if module.weight is not None:
                nn.init.ones_(module.weight)
            bias = getattr(module, "bias", None)  # RMSNorm has none
            if bias is not None:
                nn.init.zeros_(bias)
    if config.norm_first:
        for module in model.modules():
            if isinstance(module, MultiHeadAttention):
                nn.init.normal_(module.out_proj.weight, 0.0, residual_std)
            elif isinstance(module, (FeedForward, GatedFeedForward)):
                nn.init.normal_(module.linear2.weight, 0.0, residual_std)
