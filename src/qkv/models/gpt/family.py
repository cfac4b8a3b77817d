"""GPT's description: a language model with one causal stack, imported from GPT-2 checkpoints."""

from __future__ import annotations

from qkv.models.config import NORM_TITLES
from qkv.models.description import LANGUAGE_MODEL, Family, LoRATarget
from qkv.models.gpt import gguf, huggingface
from qkv.models.gpt.config import GPTConfig
from qkv.models.gpt.model import GPT
from qkv.models.gpt.presets import PRESETS

BLOCK = "decoder.blocks.{i}."
HF_BLOCK = "transformer.h.{i}."
LORA_TARGETS = {  # GPT-2's Conv1D names; c_attn is W_q, W_k and W_v in one matrix: one adapter over the three
    "c_attn": LoRATarget(
        tuple(BLOCK + "self_attn." + p for p in ("query", "key", "value")), HF_BLOCK + "attn.c_attn", transposed=True
    ),
    "attn.c_proj": LoRATarget((BLOCK + "self_attn.out_proj",), HF_BLOCK + "attn.c_proj", transposed=True),  # W_o
    "c_fc": LoRATarget((BLOCK + "feed_forward.linear1",), HF_BLOCK + "mlp.c_fc", transposed=True),  # W_1
    "mlp.c_proj": LoRATarget((BLOCK + "feed_forward.linear2",), HF_BLOCK + "mlp.c_proj", transposed=True),  # W_2
}

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
    masked=frozenset({"decoder"}),
    output="decoder",
    embedding="embedding.token_embedding",
    unembedding="unembedding",
    decode_step="causal",
    presets=PRESETS,
    hf_architectures=("GPT2LMHeadModel",),
    hf_model_types=("gpt2",),
    hf_conversion=huggingface,
    gguf=gguf,
    lora_targets=LORA_TARGETS,
    lora_default=("c_attn",),
    context=lambda config: config.context_length,
    positional=lambda config: config.positional,
    input_norm=lambda config: NORM_TITLES[config.norm] if config.norm_first else None,
    layer_fields=("n_layers",),
    cached_layers="n_layers",
)
