"""Word2Vec's one named size: word2vec's and gensim's default width.

A preset fixes the architecture; the vocabulary size usually comes from the tokenizer
(:func:`qkv.models.presets.make_config` fills it in).
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "word2vec": dict(d_model=100),  # word2vec's and gensim's default size
}
