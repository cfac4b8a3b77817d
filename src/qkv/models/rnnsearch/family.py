"""RNNSearch's description: a translator of GRUs and one additive alignment, no Transformer blocks."""

from __future__ import annotations

from qkv.models.description import TRANSLATOR, Family
from qkv.models.rnnsearch.config import RNNSearchConfig
from qkv.models.rnnsearch.model import RNNSearch
from qkv.models.rnnsearch.presets import PRESETS


def summary(config: RNNSearchConfig) -> str:
    """The architecture and its sizes in one line (the paper's m, n, n', l)."""
    return (
        f"RNNSearch (bidirectional GRU encoder, GRU decoder with additive attention; embeddings "
        f"{config.d_embedding}, GRU states {config.d_hidden}, alignment {config.d_attention}, maxout "
        f"{config.d_readout})"
    )


FAMILY = Family(
    name="rnnsearch",
    config=RNNSearchConfig,
    model=RNNSearch,
    title="RNNSearch (GRUs and one additive alignment, no Transformer blocks)",
    role=TRANSLATOR,
    capabilities=frozenset({"alignment", "embeddings", "unembedding"}),
    attention_notes={
        "cross": "additive attention: while writing each target token, where the decoder's state looks in "
        "the source (the alignment of Bahdanau et al. 2015)"
    },
    instead="use `qkv attention` for its alignment or `qkv next` for its predictions, or a Transformer translator",
    embedding="src_embedding.token_embedding",
    unembedding="unembedding",
    target_embedding="tgt_embedding.token_embedding",
    decode_step=None,  # the model's own step: a GRU state and an alignment, no KV cache to make static
    presets=PRESETS,
    # the recipe it trains best with: AdamW throughout (docs/rnnsearch.md)
    train_defaults=dict(preset="rnnsearch-small", optimizer="adamw"),
    summary=summary,
    context=lambda config: config.context_length,
    width=lambda config: config.d_hidden,  # the GRU state the decoder passes
)
