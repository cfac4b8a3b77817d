"""The building blocks of the Transformer, each in its own module (attention, positions, FFN, blocks).

The step-by-step build-up of attention that teaches it (Raschka, ch. 3) is :mod:`qkv.teaching.attention_steps`.
"""

from qkv.layers.additive import AdditiveAttention
from qkv.layers.attention import (
    MultiHeadAttention,
    attention_mask,
    attention_scores,
    causal_mask,
    masked_softmax,
    scaled_dot_product_attention,
)
from qkv.layers.blocks import DecoderBlock, EncoderBlock, ResidualSublayer
from qkv.layers.capture import capture, record
from qkv.layers.embedding import InputEmbedding, TokenEmbedding, Unembedding
from qkv.layers.feedforward import FeedForward
from qkv.layers.gru import BidirectionalGRU, gru_step
from qkv.layers.kv_cache import KVCache, LayerKVCache
from qkv.layers.maxout import Maxout
from qkv.layers.positional import (
    LearnedPositionalEncoding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    apply_rotary,
    sinusoidal_table,
)
from qkv.layers.softmax import log_softmax, softmax
from qkv.layers.stacks import DecoderStack, EncoderStack

__all__ = [
    "AdditiveAttention",
    "BidirectionalGRU",
    "DecoderBlock",
    "DecoderStack",
    "EncoderBlock",
    "EncoderStack",
    "FeedForward",
    "InputEmbedding",
    "KVCache",
    "LayerKVCache",
    "LearnedPositionalEncoding",
    "Maxout",
    "MultiHeadAttention",
    "ResidualSublayer",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "TokenEmbedding",
    "Unembedding",
    "apply_rotary",
    "attention_scores",
    "capture",
    "causal_mask",
    "attention_mask",
    "gru_step",
    "log_softmax",
    "masked_softmax",
    "record",
    "scaled_dot_product_attention",
    "sinusoidal_table",
    "softmax",
]
