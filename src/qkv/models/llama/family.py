"""Llama's description: GPT's, with its own config, model, presets, training default and Hugging Face types.

Everything the views and the decoding engine read (role, capabilities, streams, the decode step) is GPT's:
the flow is the same, and what differs lives in the layers the config chooses.
"""

from __future__ import annotations

from dataclasses import replace

from qkv.models.gpt.family import FAMILY as GPT_FAMILY
from qkv.models.llama import gguf, huggingface
from qkv.models.llama.config import LlamaConfig
from qkv.models.llama.model import Llama
from qkv.models.llama.presets import PRESETS

FAMILY = replace(
    GPT_FAMILY,
    name="llama",
    config=LlamaConfig,
    model=Llama,
    title="a Llama-style language model (decoder only: RMSNorm, SwiGLU, grouped-query attention, RoPE)",
    presets=PRESETS,
    train_defaults=dict(preset="llama-micro"),  # gpt-micro's size, grouped-query attention, SwiGLU
    hf_architectures=("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"),
    hf_model_types=("llama", "qwen2", "mistral"),
    hf_conversion=huggingface,
    gguf=gguf,
)
