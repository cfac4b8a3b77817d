"""RNNSearchConfig: the sizes of the recurrent translator attention was first made for (the paper's m, n,
n', l)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from qkv.errors import QkvError
from qkv.models.config import ModelConfig


@dataclass
class RNNSearchConfig(ModelConfig):
    """RNNSearch (Bahdanau et al. 2015): a bidirectional GRU encoder and a GRU decoder whose state queries
    the encoder states through additive attention (:mod:`qkv.models.rnnsearch`).

    The paper's names: m = ``d_embedding`` (620 in the paper), n = ``d_hidden`` (1000: each direction of
    the encoder, and the decoder), n' = ``d_attention`` (1000: the alignment model's hidden layer), l =
    ``d_readout`` (500: maxout units before the output layer). An RNN has no position table:
    ``context_length`` is the longest sentence the batches keep and decoding writes (the paper's
    RNNsearch-50 was trained on sentences of up to 50 words).
    """

    kind: ClassVar[str] = "rnnsearch"

    src_vocab_size: int = 256
    tgt_vocab_size: int = 256
    d_embedding: int = 256  # m: word embeddings, source and target
    d_hidden: int = 256  # n: GRU state of each encoder direction and of the decoder
    d_attention: int = 256  # n': hidden layer of the additive alignment model
    d_readout: int = 256  # l: maxout units between the decoder and the output layer
    dropout: float = 0.0  # on the embeddings and on the maxout output
    share_embeddings: bool = False  # one embedding matrix for source and target (needs a shared vocabulary)
    tie_embeddings: bool = True  # the output layer W_o reuses the target embedding (needs d_readout == d_embedding)
    context_length: int = 128  # the longest source or target sentence, in tokens
    pad_id: int = 0

    def validate(self) -> None:
        self._require_positive(
            "src_vocab_size", "tgt_vocab_size", "d_embedding", "d_hidden", "d_attention", "d_readout", "context_length"
        )
        if not 0.0 <= self.dropout < 1.0:
            raise QkvError(f"dropout={self.dropout} must be in [0, 1)")
        if self.tie_embeddings and self.d_readout != self.d_embedding:
            raise QkvError(
                f"tie_embeddings makes the output layer reuse the target embedding, so d_readout={self.d_readout} "
                f"must equal d_embedding={self.d_embedding}: make them equal or set tie_embeddings to false"
            )
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise QkvError(
                f"share_embeddings needs one vocabulary, but src_vocab_size={self.src_vocab_size} and "
                f"tgt_vocab_size={self.tgt_vocab_size}: use a shared tokenizer or turn share_embeddings off"
            )

    # What the views written for the Transformer read (layers, heads, width), answered for RNNSearch.
    @property
    def n_encoder_layers(self) -> int:
        """One bidirectional GRU layer."""
        return 1

    @property
    def n_decoder_layers(self) -> int:
        """One GRU layer."""
        return 1

    @property
    def n_heads(self) -> int:
        """Additive attention has one head: one alignment per target token."""
        return 1

    @property
    def d_model(self) -> int:
        """The decoder state's width n (the Noam schedule and the server's model description read it)."""
        return self.d_hidden
