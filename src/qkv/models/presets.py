"""Named model sizes, from the paper's base model and GPT-2 small down to ones that train on a laptop CPU,
the Llama family (small ones, and the shapes of SmolLM-135M and Qwen2-0.5B), and RNNSearch, the recurrent
translator that came before (at the paper's proportions and a small one).

A preset fixes the architecture; the vocabulary size usually comes from the tokenizer, so
``make_config("gpt-mini", vocab_size=tokenizer.vocab_size)`` fills it in. Any field can be overridden.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from qkv.errors import QkvError
from qkv.models.config import (
    EncoderConfig,
    GPTConfig,
    LlamaConfig,
    ModelConfig,
    RNNSearchConfig,
    TransformerConfig,
    Word2VecConfig,
)

_GPT2 = dict(
    activation="gelu_tanh",
    norm_first=True,
    positional="learned",
    tie_embeddings=True,
    bias=True,
    context_length=1024,
    vocab_size=50257,
    dropout=0.1,
)
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
_PAPER = dict(
    activation="relu",
    norm_first=False,
    positional="sinusoidal",
    scale_embeddings=True,
    tie_embeddings=True,
    final_norm=False,
)

PRESETS: dict[str, tuple[type[ModelConfig], dict[str, Any]]] = {
    # --- decoder-only language models -------------------------------------------------------------
    # Small enough for a laptop CPU; rotary positions and pre-LN (see docs/training.md for why).
    "gpt-nano": (GPTConfig, dict(n_layers=2, d_model=64, n_heads=4, context_length=64, positional="rope")),
    "gpt-micro": (GPTConfig, dict(n_layers=4, d_model=128, n_heads=4, context_length=64, positional="rope")),
    "gpt-mini": (GPTConfig, dict(n_layers=4, d_model=192, n_heads=6, context_length=128, positional="rope")),
    "gpt-small-cpu": (
        GPTConfig,
        dict(n_layers=6, d_model=256, n_heads=8, context_length=1024, positional="rope"),
    ),
    # GPT-2 (Radford et al. 2019): 124,439,808 parameters for the small one, embeddings tied.
    "gpt2-small": (GPTConfig, dict(_GPT2, n_layers=12, d_model=768, n_heads=12)),
    "gpt2-medium": (GPTConfig, dict(_GPT2, n_layers=24, d_model=1024, n_heads=16)),
    "gpt2-large": (GPTConfig, dict(_GPT2, n_layers=36, d_model=1280, n_heads=20)),
    "gpt2-xl": (GPTConfig, dict(_GPT2, n_layers=48, d_model=1600, n_heads=25)),
    # --- the Llama family: RMSNorm, SwiGLU (d_ff 8/3 d_model), RoPE, grouped-query attention -------
    # The GPT sizes above with 2 key/value heads (the KV cache is a half or a quarter of the GPT's).
    "llama-micro": (LlamaConfig, dict(n_layers=4, d_model=128, n_heads=4, n_kv_heads=2, context_length=64)),
    "llama-mini": (LlamaConfig, dict(n_layers=4, d_model=192, n_heads=6, n_kv_heads=2, context_length=128)),
    "llama-small": (LlamaConfig, dict(n_layers=6, d_model=256, n_heads=8, n_kv_heads=2, context_length=1024)),
    # SmolLM-135M (Hugging Face 2024, HuggingFaceTB/SmolLM-135M): 134,515,008 parameters, embeddings tied.
    "smollm-135m": (
        LlamaConfig,
        dict(
            n_layers=30,
            d_model=576,
            n_heads=9,
            n_kv_heads=3,
            d_ff=1536,
            vocab_size=49152,
            context_length=2048,
            rope_base=10000.0,
            tie_embeddings=True,
        ),
    ),
    # Qwen2-0.5B (Qwen team 2024): 494,032,768 parameters; biases on W_q, W_k, W_v only, embeddings tied.
    # Its config allows 131,072 positions; 32,768 is the context it was trained for (and Qwen2.5-0.5B's).
    "qwen2-0.5b": (
        LlamaConfig,
        dict(
            n_layers=24,
            d_model=896,
            n_heads=14,
            n_kv_heads=2,
            d_ff=4864,
            vocab_size=151936,
            context_length=32768,
            rope_base=1e6,
            layer_norm_eps=1e-6,
            qkv_bias=True,
            tie_embeddings=True,
        ),
    ),
    # --- encoder-only (BERT family) --------------------------------------------------------------
    "bert-base": (EncoderConfig, dict(_BERT, n_layers=12, d_model=768, n_heads=12)),
    "minilm-l6": (EncoderConfig, dict(_BERT, n_layers=6, d_model=384, n_heads=12)),
    "encoder-mini": (EncoderConfig, dict(n_layers=2, d_model=128, n_heads=4, context_length=128)),
    # --- encoder-decoder (the paper) ------------------------------------------------------------
    # Vaswani et al. 2017, Table 3 "base": N=6, d_model=512, h=8, d_k=d_v=64, d_ff=2048, P_drop=0.1,
    # shared source/target BPE vocabulary of about 37000 tokens.
    "transformer-base": (
        TransformerConfig,
        dict(
            _PAPER,
            n_encoder_layers=6,
            n_decoder_layers=6,
            d_model=512,
            n_heads=8,
            d_ff=2048,
            dropout=0.1,
            src_vocab_size=37000,
            tgt_vocab_size=37000,
            share_embeddings=True,
            context_length=512,
        ),
    ),
    "transformer-big": (
        TransformerConfig,
        dict(
            _PAPER,
            n_encoder_layers=6,
            n_decoder_layers=6,
            d_model=1024,
            n_heads=16,
            d_ff=4096,
            dropout=0.3,
            src_vocab_size=37000,
            tgt_vocab_size=37000,
            share_embeddings=True,
            context_length=512,
        ),
    ),
    "transformer-mini": (
        TransformerConfig,
        dict(
            _PAPER,
            n_encoder_layers=3,
            n_decoder_layers=3,
            d_model=256,
            n_heads=4,
            d_ff=1024,
            dropout=0.1,
            context_length=256,
        ),
    ),
    "transformer-tiny": (
        TransformerConfig,
        dict(
            _PAPER,
            n_encoder_layers=2,
            n_decoder_layers=2,
            d_model=128,
            n_heads=4,
            d_ff=512,
            dropout=0.0,
            context_length=128,
        ),
    ),
    # --- word vectors (qkv train --task word2vec) ---------------------------------------------------
    "word2vec": (Word2VecConfig, dict(d_model=100)),  # word2vec's and gensim's default size
    # --- the recurrent translator attention was invented for (Bahdanau et al. 2015) ------------------
    # A size that trains on a CPU: 256-wide embeddings, GRU states, alignment model and maxout readout,
    # the output layer tied to the target embedding.
    "rnnsearch-small": (
        RNNSearchConfig,
        dict(d_embedding=256, d_hidden=256, d_attention=256, d_readout=256, dropout=0.2, context_length=128),
    ),
    # The paper's RNNsearch-50: m = 620, n = n' = 1000, l = 500 maxout units, 30,000 words per language,
    # untied output layer, trained on sentences of up to 50 words.
    "rnnsearch-50": (
        RNNSearchConfig,
        dict(
            d_embedding=620,
            d_hidden=1000,
            d_attention=1000,
            d_readout=500,
            tie_embeddings=False,
            src_vocab_size=30000,
            tgt_vocab_size=30000,
            context_length=50,
        ),
    ),
}


def check_overrides(preset: str, names: Iterable[str]) -> None:
    """QkvError unless ``preset`` exists and its model has every field in ``names`` (``max_len`` included)."""
    if preset not in PRESETS:
        raise QkvError(f"unknown preset {preset!r}: choose one of {', '.join(PRESETS)}")
    cls = PRESETS[preset][0]
    unknown = sorted(set(names) - {f.name for f in dataclasses.fields(cls)} - {"max_len"})
    if unknown:
        raise QkvError(
            f"a {cls.kind} model has no {', '.join(unknown)} (preset {preset!r}): drop "
            f"{'that setting' if len(unknown) == 1 else 'those settings'} or choose a preset with "
            f"{'that field' if len(unknown) == 1 else 'those fields'}"
        )


def make_config(preset: str, **overrides: Any) -> ModelConfig:
    """The config of a named preset with some fields replaced (validated)."""
    check_overrides(preset, overrides)
    cls, fields = PRESETS[preset]
    if "max_len" in overrides and "context_length" not in overrides:  # the name before the rename to context_length
        overrides["context_length"] = overrides.pop("max_len")
    return cls(**{**fields, **overrides})
