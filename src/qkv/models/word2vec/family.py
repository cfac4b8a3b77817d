"""Word2Vec's description: one matrix of word vectors, no Transformer."""

from __future__ import annotations

from qkv.models.description import WORD_VECTORS, Family
from qkv.models.word2vec.config import Word2VecConfig
from qkv.models.word2vec.model import Word2Vec
from qkv.models.word2vec.presets import PRESETS

FAMILY = Family(
    name="word2vec",
    config=Word2VecConfig,
    model=Word2Vec,
    title="Word2Vec (one matrix of word vectors, no Transformer)",
    role=WORD_VECTORS,
    capabilities=frozenset({"embeddings"}),
    instead="use `qkv embeddings`",
    embedding="token_embedding",
    presets=PRESETS,
)
