"""LlamaConfig: a GPTConfig whose defaults are the modern decoder's layers.

Written as GPT plus its differences: GPTConfig's fields with the modern decoder's defaults (the layers read
them, :mod:`qkv.layers`), and one field of its own, ``sliding_window``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from qkv.errors import QkvError
from qkv.models.gpt.config import GPTConfig


@dataclass
class LlamaConfig(GPTConfig):
    """The decoder-only family Llama, Qwen2, SmolLM and Mistral share: a GPT built with RMSNorm before each
    sublayer, a SwiGLU feed-forward, rotary positions (base ``rope_base``, Hugging Face's rope_theta),
    grouped-query attention (``n_kv_heads``) and no biases (Qwen2 keeps biases on W_q, W_k, W_v:
    ``qkv_bias``). ``sliding_window``: each position attends to the last that many positions, its own
    included (Mistral v0.1's 4096); None: to the whole context."""

    kind: ClassVar[str] = "llama"

    norm: str = "rmsnorm"
    feed_forward: str = "glu"
    activation: str = "silu"
    positional: str = "rope"
    bias: bool = False
    tie_embeddings: bool = False
    layer_norm_eps: float = 1e-5
    sliding_window: int | None = None

    def validate(self) -> None:
        super().validate()
        window = self.sliding_window
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise QkvError(
                f"sliding_window={window!r} must be a positive whole number of positions, or null for attention "
                "over the whole context"
            )
