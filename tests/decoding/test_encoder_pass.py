"""The encoder's inference pass gives the model's own contextual vectors, padding and all."""

from __future__ import annotations

import pytest
import torch

from qkv.decoding.encoder_pass import encoder_hidden
from qkv.decoding.fast_step import fast_step_for, resolve_step
from qkv.decoding.sessions import encode
from qkv.layers.fused import fuse_linears
from qkv.models import Encoder, EncoderConfig


@pytest.mark.parametrize(
    "variant",
    [
        dict(norm_first=False, type_vocab_size=2, embedding_norm=True, activation="gelu"),  # BERT's layout
        dict(positional="rope"),
        dict(positional="sinusoidal", bias=False),
    ],
)
def test_encoder_pass_equals_the_forward(variant: dict) -> None:
    torch.manual_seed(0)
    model = Encoder(EncoderConfig(vocab_size=30, d_model=32, n_heads=4, n_layers=2, **variant)).double().eval()
    ids = torch.randint(1, 30, (4, 9))
    padding = torch.arange(9)[None] >= torch.tensor([9, 3, 6, 0])[:, None]  # the last row is all padding
    projections = [fuse_linears(b.self_attn.query, b.self_attn.key, b.self_attn.value) for b in model.encoder.blocks]
    with torch.no_grad():
        for mask in (padding, None):
            expected = model(ids, padding_mask=mask)
            torch.testing.assert_close(encoder_hidden(model, projections, ids, mask), expected, atol=1e-12, rtol=0)


def test_encode_chooses_the_pass_by_engine() -> None:
    model = Encoder(EncoderConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=1)).eval()
    assert resolve_step(model, "auto") == "static" and resolve_step(model, "compiled") == "static"
    assert resolve_step(model, "model") == "model"
    ids = torch.randint(30, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(encode(model, ids), encode(model, ids, step="model"), atol=1e-6, rtol=0)
    assert len(fast_step_for(model).projections) == 1
