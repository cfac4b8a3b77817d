"""Llama's description: GPT's, with its own config, model, presets, training default and Hugging Face types.

Everything the views and the decoding engine read (role, capabilities, streams, the decode step) is GPT's:
the flow is the same, and what differs lives in the layers the config chooses.
"""

from __future__ import annotations

from dataclasses import replace

from qkv.models.description import LoRATarget
from qkv.models.gpt.family import FAMILY as GPT_FAMILY
from qkv.models.llama import gguf, huggingface
from qkv.models.llama.config import LlamaConfig
from qkv.models.llama.model import Llama
from qkv.models.llama.presets import PRESETS

BLOCK = "decoder.blocks.{i}."
HF_BLOCK = "model.layers.{i}."
LORA_TARGETS = {  # PEFT's names (Hugging Face's modules) -> qkv's, as models/llama/huggingface.py's table maps them
    "q_proj": LoRATarget((BLOCK + "self_attn.query",), HF_BLOCK + "self_attn.q_proj"),  # W_q
    "k_proj": LoRATarget((BLOCK + "self_attn.key",), HF_BLOCK + "self_attn.k_proj"),  # W_k
    "v_proj": LoRATarget((BLOCK + "self_attn.value",), HF_BLOCK + "self_attn.v_proj"),  # W_v
    "o_proj": LoRATarget((BLOCK + "self_attn.out_proj",), HF_BLOCK + "self_attn.o_proj"),  # W_o
    "gate_proj": LoRATarget((BLOCK + "feed_forward.gate",), HF_BLOCK + "mlp.gate_proj"),  # W_g
    "up_proj": LoRATarget((BLOCK + "feed_forward.linear1",), HF_BLOCK + "mlp.up_proj"),  # W_1
    "down_proj": LoRATarget((BLOCK + "feed_forward.linear2",), HF_BLOCK + "mlp.down_proj"),  # W_2
}

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
    lora_targets=LORA_TARGETS,
    lora_default=("q_proj", "v_proj"),  # PEFT's default for Llama; "all" adapts every projection
)
