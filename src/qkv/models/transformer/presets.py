"""The paper's encoder-decoder at its sizes (Vaswani et al. 2017, Table 3) and two small ones.

A preset fixes the architecture; the vocabulary size usually comes from the tokenizer
(:func:`qkv.models.presets.make_config` fills it in).
"""

from __future__ import annotations

from typing import Any

_PAPER = dict(
    activation="relu",
    norm_first=False,
    positional="sinusoidal",
    scale_embeddings=True,
    tie_embeddings=True,
    final_norm=False,
)

PRESETS: dict[str, dict[str, Any]] = {
    # Vaswani et al. 2017, Table 3 "base": N=6, d_model=512, h=8, d_k=d_v=64, d_ff=2048, P_drop=0.1,
    # shared source/target BPE vocabulary of about 37000 tokens.
    "transformer-base": dict(
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
    "transformer-big": dict(
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
    "transformer-mini": dict(
        _PAPER,
        n_encoder_layers=3,
        n_decoder_layers=3,
        d_model=256,
        n_heads=4,
        d_ff=1024,
        dropout=0.1,
        context_length=256,
    ),
    "transformer-tiny": dict(
        _PAPER,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_model=128,
        n_heads=4,
        d_ff=512,
        dropout=0.0,
        context_length=128,
    ),
}
