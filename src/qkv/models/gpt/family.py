"""GPT's description: a language model with one causal stack, imported from GPT-2 checkpoints."""

from __future__ import annotations

from qkv.models.description import LANGUAGE_MODEL, Family
from qkv.models.gpt import gguf, huggingface
from qkv.models.gpt.config import GPTConfig
from qkv.models.gpt.model import GPT
from qkv.models.gpt.presets import PRESETS

FAMILY = Family(
    name="gpt",
    config=GPTConfig,
    model=GPT,
    title="a GPT language model (decoder only)",
    role=LANGUAGE_MODEL,
    capabilities=frozenset({"residual stream", "self-attention heads", "embeddings", "positions", "unembedding"}),
    attention_notes={"decoder": "causal self-attention: each token looks at itself and the tokens before it"},
    instead="use a translator for cross-attention",
    streams={"decoder": ("embedding", "decoder")},
    output="decoder",
    embedding="embedding.token_embedding",
    decode_step="causal",
    presets=PRESETS,
    hf_architectures=("GPT2LMHeadModel",),
    hf_model_types=("gpt2",),
    hf_conversion=huggingface,
    gguf=gguf,
)
