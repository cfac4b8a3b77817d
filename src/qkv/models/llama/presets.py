"""The Llama family's named sizes: small ones, and the shapes of SmolLM-135M and Qwen2-0.5B.

A preset fixes the architecture; the vocabulary size usually comes from the tokenizer
(:func:`qkv.models.presets.make_config` fills it in).
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # gpt-micro's, gpt-mini's and gpt-small-cpu's sizes with 2 key/value heads (the KV cache is a half or a
    # quarter of the GPT's).
    "llama-micro": dict(n_layers=4, d_model=128, n_heads=4, n_kv_heads=2, context_length=64),
    "llama-mini": dict(n_layers=4, d_model=192, n_heads=6, n_kv_heads=2, context_length=128),
    "llama-small": dict(n_layers=6, d_model=256, n_heads=8, n_kv_heads=2, context_length=1024),
    # SmolLM-135M (Hugging Face 2024, HuggingFaceTB/SmolLM-135M): 134,515,008 parameters, embeddings tied.
    "smollm-135m": dict(
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
    # Qwen2-0.5B (Qwen team 2024): 494,032,768 parameters; biases on W_q, W_k, W_v only, embeddings tied.
    # Its config allows 131,072 positions; 32,768 is the context it was trained for (and Qwen2.5-0.5B's).
    "qwen2-0.5b": dict(
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
}
