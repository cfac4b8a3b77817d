"""RNNSearch's named sizes: the paper's RNNsearch-50 and one that trains on a CPU.

A preset fixes the architecture; the vocabulary size usually comes from the tokenizer
(:func:`qkv.models.presets.make_config` fills it in).
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # A size that trains on a CPU: 256-wide embeddings, GRU states, alignment model and maxout readout,
    # the output layer tied to the target embedding.
    "rnnsearch-small": dict(
        d_embedding=256, d_hidden=256, d_attention=256, d_readout=256, dropout=0.2, context_length=128
    ),
    # The paper's RNNsearch-50: m = 620, n = n' = 1000, l = 500 maxout units, 30,000 words per language,
    # untied output layer, trained on sentences of up to 50 words.
    "rnnsearch-50": dict(
        d_embedding=620,
        d_hidden=1000,
        d_attention=1000,
        d_readout=500,
        tie_embeddings=False,
        src_vocab_size=30000,
        tgt_vocab_size=30000,
        context_length=50,
    ),
}
