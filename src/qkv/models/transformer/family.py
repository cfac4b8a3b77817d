"""The encoder-decoder's description: a translator with two stacks and cross-attention, imported from Marian."""

from __future__ import annotations

from qkv.models.config import NORM_TITLES
from qkv.models.description import TRANSLATOR, Family
from qkv.models.transformer import huggingface
from qkv.models.transformer.config import TransformerConfig
from qkv.models.transformer.model import Transformer
from qkv.models.transformer.presets import PRESETS


def summary(config: TransformerConfig) -> str:
    """The architecture and its sizes in one line."""
    return (
        f"encoder-decoder Transformer ({config.n_encoder_layers}+{config.n_decoder_layers} layers, d_model "
        f"{config.d_model}, {config.n_heads} heads)"
    )


FAMILY = Family(
    name="transformer",
    config=TransformerConfig,
    model=Transformer,
    title="an encoder-decoder translator",
    role=TRANSLATOR,
    capabilities=frozenset(
        {"residual stream", "self-attention heads", "cross-attention", "embeddings", "positions", "unembedding"}
    ),
    attention_notes={
        "encoder": "encoder self-attention: each source token looks at every source token",
        "decoder": "decoder masked self-attention: each target position looks at itself and the ones before",
        "cross": "cross-attention: while writing each target token, where the decoder looks in the source",
    },
    instead="use `qkv translate`",
    streams={"encoder": ("src_embedding", "encoder"), "decoder": ("tgt_embedding", "decoder")},
    masked=frozenset({"decoder"}),
    output="decoder",
    embedding="src_embedding.token_embedding",
    unembedding="unembedding",
    target_embedding="tgt_embedding.token_embedding",
    decode_step="cross",
    presets=PRESETS,
    summary=summary,
    hf_architectures=("MarianMTModel",),
    hf_model_types=("marian",),
    hf_conversion=huggingface,
    context=lambda config: config.context_length,
    positional=lambda config: config.positional,
    input_norm=lambda config: NORM_TITLES[config.norm] if config.norm_first else None,
    layer_fields=("n_encoder_layers", "n_decoder_layers"),
    cached_layers="n_decoder_layers",
)
