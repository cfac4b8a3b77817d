"""EncoderConfig: the sizes of an encoder-only model (the BERT family)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from qkv.models.config import BaseConfig


@dataclass
class EncoderConfig(BaseConfig):
    """Encoder-only model (BERT family): bidirectional self-attention, one vector per token out."""

    kind: ClassVar[str] = "encoder"

    vocab_size: int = 256
    context_length: int = 512
    n_layers: int = 4
    type_vocab_size: int = 0  # BERT's segment embeddings (0: none)
    embedding_norm: bool = False  # LayerNorm on the summed embeddings (BERT)
    pad_id: int = 0

    def validate(self) -> None:
        super().validate()
        self._require_positive("vocab_size", "n_layers")
