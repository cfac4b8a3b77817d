"""qkv: the Transformer, completely and for real.

    from qkv import GPT, GPTConfig
    model = GPT(GPTConfig(vocab_size=100, d_model=64, n_heads=4, n_layers=2, context_length=32))
    logits = model(token_ids)                       # (B, T, vocab_size)

See README.md for a tour and docs/ for one page per task.
"""

from qkv.errors import QkvError
from qkv.layers import MultiHeadAttention, capture, softmax
from qkv.models import (
    GPT,
    PRESETS,
    Encoder,
    EncoderConfig,
    GPTConfig,
    RNNSearch,
    RNNSearchConfig,
    Transformer,
    TransformerConfig,
    make_config,
    next_token_distribution,
)

__version__ = "0.1.0"

__all__ = [
    "GPT",
    "PRESETS",
    "Encoder",
    "EncoderConfig",
    "GPTConfig",
    "MultiHeadAttention",
    "QkvError",
    "RNNSearch",
    "RNNSearchConfig",
    "Transformer",
    "TransformerConfig",
    "capture",
    "make_config",
    "next_token_distribution",
    "softmax",
]
