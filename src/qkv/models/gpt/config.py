"""GPTConfig: the sizes of a decoder-only language model (GPT-2 and the small CPU ones)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from qkv.models.config import BaseConfig


@dataclass
class GPTConfig(BaseConfig):
    """Decoder-only language model (GPT): causal self-attention blocks over one token stream."""

    kind: ClassVar[str] = "gpt"

    vocab_size: int = 256
    n_layers: int = 4

    def validate(self) -> None:
        super().validate()
        self._require_positive("vocab_size", "n_layers")
