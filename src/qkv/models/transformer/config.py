"""TransformerConfig: the sizes of the paper's encoder-decoder (and Marian's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from qkv.errors import QkvError
from qkv.models.config import BaseConfig


@dataclass
class TransformerConfig(BaseConfig):
    """The paper's encoder-decoder: the encoder reads the source, the decoder writes the target."""

    kind: ClassVar[str] = "transformer"

    src_vocab_size: int = 256
    tgt_vocab_size: int = 256
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    share_embeddings: bool = False  # one embedding matrix for source and target (needs a shared vocabulary)
    final_logits_bias: bool = False  # a bias on the output logits (Marian)
    pad_id: int = 0

    def validate(self) -> None:
        super().validate()
        self._require_positive("src_vocab_size", "tgt_vocab_size", "n_encoder_layers", "n_decoder_layers")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise QkvError(
                f"share_embeddings needs one vocabulary, but src_vocab_size={self.src_vocab_size} and "
                f"tgt_vocab_size={self.tgt_vocab_size}: use a shared tokenizer or turn share_embeddings off"
            )
