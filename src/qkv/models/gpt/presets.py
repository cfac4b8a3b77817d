"""GPT's named sizes: small ones that train on a laptop CPU, and GPT-2's four (Radford et al. 2019).

A preset fixes the architecture; the vocabulary size usually comes from the tokenizer
(:func:`qkv.models.presets.make_config` fills it in).
"""

from __future__ import annotations

from typing import Any

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

PRESETS: dict[str, dict[str, Any]] = {
    # Small enough for a laptop CPU; rotary positions and pre-LN (see docs/training.md for why).
    "gpt-nano": dict(n_layers=2, d_model=64, n_heads=4, context_length=64, positional="rope"),
    "gpt-micro": dict(n_layers=4, d_model=128, n_heads=4, context_length=64, positional="rope"),
    "gpt-mini": dict(n_layers=4, d_model=192, n_heads=6, context_length=128, positional="rope"),
    "gpt-small-cpu": dict(n_layers=6, d_model=256, n_heads=8, context_length=1024, positional="rope"),
    # GPT-2 (Radford et al. 2019): 124,439,808 parameters for the small one, embeddings tied.
    "gpt2-small": dict(_GPT2, n_layers=12, d_model=768, n_heads=12),
    "gpt2-medium": dict(_GPT2, n_layers=24, d_model=1024, n_heads=16),
    "gpt2-large": dict(_GPT2, n_layers=36, d_model=1280, n_heads=20),
    "gpt2-xl": dict(_GPT2, n_layers=48, d_model=1600, n_heads=25),
}
