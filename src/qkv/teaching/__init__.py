"""The step-by-step build-ups that teach a mechanism, kept apart from the layers the models use.

:mod:`qkv.teaching.attention_steps` builds self-attention as Raschka's chapter 3 does (no weights, trainable
weights, causal, a wrapper of heads), each step checked against qkv's :class:`~qkv.layers.MultiHeadAttention`.
"""

from qkv.teaching.attention_steps import (
    CausalAttention,
    MultiHeadAttentionWrapper,
    SelfAttentionV1,
    SelfAttentionV2,
    attention_without_weights,
    causal_weights_masked,
    causal_weights_renormalized,
    naive_softmax,
    simple_normalize,
    wrapper_to_multihead,
)

__all__ = [
    "CausalAttention",
    "MultiHeadAttentionWrapper",
    "SelfAttentionV1",
    "SelfAttentionV2",
    "attention_without_weights",
    "causal_weights_masked",
    "causal_weights_renormalized",
    "naive_softmax",
    "simple_normalize",
    "wrapper_to_multihead",
]
