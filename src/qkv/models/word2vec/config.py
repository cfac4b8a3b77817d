"""Word2VecConfig: the vocabulary and the width of the word vectors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from qkv.models.config import ModelConfig


@dataclass
class Word2VecConfig(ModelConfig):
    """Word2Vec (Mikolov et al., 2013): one input vector per word (the rows of W_E, the word vectors) and
    one output vector per word that only training uses (skip-gram or CBOW with negative sampling)."""

    kind: ClassVar[str] = "word2vec"

    vocab_size: int = 256
    d_model: int = 100  # the dimension of the word vectors (word2vec's ``size``, gensim's ``vector_size``)

    def validate(self) -> None:
        self._require_positive("vocab_size", "d_model")
