"""The step-by-step build-ups that teach a mechanism, kept apart from the layers the models use.

:mod:`qkv.teaching.attention_steps` builds self-attention as Raschka's chapter 3 does (no weights, trainable
weights, causal, a wrapper of heads), each step checked against qkv's :class:`~qkv.layers.MultiHeadAttention`.
"""
