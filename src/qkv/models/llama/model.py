"""Llama: the decoder-only family that Llama, Qwen2, SmolLM and Mistral share, as a :class:`~qkv.models.GPT`.

The flow is GPT's (token ids -> W_E -> N causal blocks -> final norm -> W_U -> logits); what changed since
GPT-2 lives in the layers, chosen by :class:`~qkv.models.llama.config.LlamaConfig`:

- RMSNorm instead of LayerNorm: x / sqrt(mean(x^2) + eps) * g, no mean subtracted and no bias;
- a SwiGLU feed-forward: W_2 (silu(W_g x) * W_1 x), three matrices of width d_ff;
- rotary positions (RoPE) on queries and keys instead of a position table added to W_E;
- grouped-query attention: n_kv_heads key/value heads, each shared by n_heads / n_kv_heads query heads, so
  the KV cache holds n_kv_heads heads (1: multi-query attention);
- no biases (Qwen2 keeps them on W_q, W_k, W_v), and W_U untied from W_E unless the config ties them;
- optionally, a causal sliding window (``sliding_window``: Mistral v0.1, Qwen2 with use_sliding_window):
  each position attends to the last ``sliding_window`` positions only. This is the one difference the
  model itself hands to GPT; the rest are the config's choices of layers.
"""

from __future__ import annotations

from qkv.models.gpt.model import GPT
from qkv.models.llama.config import LlamaConfig


class Llama(GPT):
    """A Llama-style decoder-only language model built from a :class:`LlamaConfig`."""

    config: LlamaConfig

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__(config, window=config.sliding_window)
