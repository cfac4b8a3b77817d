"""The building blocks of the Transformer, each in its own module (attention, positions, FFN, blocks)."""

from qkv.layers.additive import AdditiveAttention
from qkv.layers.attention import (
    MultiHeadAttention,
    attention_scores,
    causal_mask,
    combine_masks,
    masked_softmax,
    scaled_dot_product_attention,
)
from qkv.layers.attention_steps import (
    CausalAttention,
    MultiHeadAttentionWrapper,
    SelfAttentionV1,
    SelfAttentionV2,
    attention_without_weights,
    causal_weights_masked,
    causal_weights_renormalized,
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
    "CausalAttention",
    "MultiHeadAttentionWrapper",
    "SelfAttentionV1",
    "SelfAttentionV2",
    "attention_without_weights",
    "causal_weights_masked",
    "causal_weights_renormalized",
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
    "combine_masks",
    "gru_step",
    "log_softmax",
    "masked_softmax",
    "record",
    "scaled_dot_product_attention",
    "sinusoidal_table",
    "softmax",
]
