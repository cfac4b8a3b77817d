"""The encoder's description: bidirectional self-attention, one vector per token, imported from BERT."""

from __future__ import annotations

from qkv.models.config import NORM_TITLES
from qkv.models.description import ENCODER, Family
from qkv.models.encoder import huggingface
from qkv.models.encoder.config import EncoderConfig
from qkv.models.encoder.model import Encoder
from qkv.models.encoder.presets import PRESETS


def _embedding_note(config: EncoderConfig) -> str | None:
    """What block 0 reads when the embeddings are BERT's (segments added, then a LayerNorm)."""
    if config.embedding_norm or config.type_vocab_size:
        return "the embeddings (+ segment embeddings, then LayerNorm, as in BERT)"
    return None


FAMILY = Family(
    name="encoder",
    config=EncoderConfig,
    model=Encoder,
    title="an encoder (BERT family)",
    role=ENCODER,
    capabilities=frozenset({"residual stream", "self-attention heads", "embeddings", "positions"}),
    attention_notes={"encoder": "self-attention: each token looks at every token of the text"},
    embedding_note=_embedding_note,
    instead="an encoder has no W_U (qkv imports BERT without its masked-LM head); use a GPT or a "
    "translator, or `qkv heads` and `qkv attention` for an encoder",
    streams={"encoder": ("embedding", "encoder")},
    embedding="embedding.token_embedding",
    decode_step="one-pass",
    presets=PRESETS,
    hf_architectures=("BertModel", "BertForMaskedLM"),
    hf_model_types=("bert",),
    hf_conversion=huggingface,
    context=lambda config: config.context_length,
    positional=lambda config: config.positional,
    input_norm=lambda config: NORM_TITLES[config.norm] if config.norm_first else None,
    layer_fields=("n_layers",),
)
