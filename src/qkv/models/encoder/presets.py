"""The encoder's named sizes: BERT-base, MiniLM-L6 (all-MiniLM-L6-v2's shape) and a small one.

A preset fixes the architecture; the vocabulary size usually comes from the tokenizer
(:func:`qkv.models.presets.make_config` fills it in).
"""

from __future__ import annotations

from typing import Any

_BERT = dict(
    activation="gelu",
    norm_first=False,
    positional="learned",
    layer_norm_eps=1e-12,
    type_vocab_size=2,
    embedding_norm=True,
    final_norm=False,
    context_length=512,
    vocab_size=30522,
    tie_embeddings=False,
    dropout=0.1,
)

PRESETS: dict[str, dict[str, Any]] = {
    "bert-base": dict(_BERT, n_layers=12, d_model=768, n_heads=12),
    "minilm-l6": dict(_BERT, n_layers=6, d_model=384, n_heads=12),
    "encoder-mini": dict(n_layers=2, d_model=128, n_heads=4, context_length=128),
}
