"""LlamaConfig: a GPTConfig whose defaults are the modern decoder's layers.

Written as GPT plus its differences: every field is GPTConfig's, and only the defaults change (the layers
read them, :mod:`qkv.layers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from qkv.models.gpt.config import GPTConfig


@dataclass
class LlamaConfig(GPTConfig):
    """The decoder-only family Llama, Qwen2, SmolLM and Mistral share: a GPT built with RMSNorm before each
    sublayer, a SwiGLU feed-forward, rotary positions (base ``rope_base``, Hugging Face's rope_theta),
    grouped-query attention (``n_kv_heads``) and no biases (Qwen2 keeps biases on W_q, W_k, W_v:
    ``qkv_bias``)."""

    kind: ClassVar[str] = "llama"

    norm: str = "rmsnorm"
    feed_forward: str = "glu"
    activation: str = "silu"
    positional: str = "rope"
    bias: bool = False
    tie_embeddings: bool = False
    layer_norm_eps: float = 1e-5
