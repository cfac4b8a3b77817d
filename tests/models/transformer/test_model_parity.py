"""qkv's post-LN encoder-decoder equals torch.nn.Transformer with copied weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from qkv.layers.stacks import DecoderStack, EncoderStack
from qkv.models import TransformerConfig
from tests.layers.reference import copy_attention

D_MODEL, HEADS, D_FF, N_ENC, N_DEC = 32, 4, 64, 2, 3


@torch.no_grad()
def copy_into_torch(encoder: EncoderStack, decoder: DecoderStack, ref: nn.Transformer) -> None:
    for ours, theirs in zip(encoder.blocks, ref.encoder.layers, strict=True):
        copy_attention(ours.self_attn, theirs.self_attn)
        theirs.linear1.load_state_dict(ours.feed_forward.linear1.state_dict())
        theirs.linear2.load_state_dict(ours.feed_forward.linear2.state_dict())
        theirs.norm1.load_state_dict(ours.attn_sublayer.norm.state_dict())
        theirs.norm2.load_state_dict(ours.ffn_sublayer.norm.state_dict())
    for ours, theirs in zip(decoder.blocks, ref.decoder.layers, strict=True):
        copy_attention(ours.self_attn, theirs.self_attn)
        copy_attention(ours.cross_attn, theirs.multihead_attn)
        theirs.linear1.load_state_dict(ours.feed_forward.linear1.state_dict())
        theirs.linear2.load_state_dict(ours.feed_forward.linear2.state_dict())
        theirs.norm1.load_state_dict(ours.self_attn_sublayer.norm.state_dict())
        theirs.norm2.load_state_dict(ours.cross_attn_sublayer.norm.state_dict())
        theirs.norm3.load_state_dict(ours.ffn_sublayer.norm.state_dict())
    ref.encoder.norm.load_state_dict(encoder.final_norm.state_dict())
    ref.decoder.norm.load_state_dict(decoder.final_norm.state_dict())


@pytest.fixture()
def pair() -> tuple[EncoderStack, DecoderStack, nn.Transformer]:
    config = TransformerConfig(
        d_model=D_MODEL,
        n_heads=HEADS,
        d_ff=D_FF,
        dropout=0.0,
        activation="relu",
        norm_first=False,
        final_norm=True,  # nn.Transformer ends both stacks with a LayerNorm
    )
    encoder, decoder = EncoderStack(config, N_ENC), DecoderStack(config, N_DEC)
    for p in list(encoder.parameters()) + list(decoder.parameters()):  # non-trivial LayerNorm weights too
        nn.init.normal_(p, 0.0, 0.3)
    ref = nn.Transformer(
        D_MODEL, HEADS, N_ENC, N_DEC, D_FF, dropout=0.0, activation="relu", batch_first=True, norm_first=False
    )
    copy_into_torch(encoder, decoder, ref)
    ref.train()  # dropout is 0; train mode keeps torch off its nested-tensor fast path
    return encoder, decoder, ref


def test_encoder_decoder_matches_nn_transformer(pair) -> None:
    encoder, decoder, ref = pair
    src, tgt = torch.randn(2, 7, D_MODEL), torch.randn(2, 5, D_MODEL)
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(5)
    expected = ref(src, tgt, tgt_mask=tgt_mask, tgt_is_causal=True)
    memory = encoder(src)
    torch.testing.assert_close(memory, ref.encoder(src), atol=1e-5, rtol=0)
    torch.testing.assert_close(decoder(tgt, memory), expected, atol=1e-5, rtol=0)


def test_encoder_decoder_with_padding_masks_matches_nn_transformer(pair) -> None:
    encoder, decoder, ref = pair
    src, tgt = torch.randn(3, 6, D_MODEL), torch.randn(3, 4, D_MODEL)
    src_pad = torch.arange(6)[None] >= torch.tensor([6, 4, 2])[:, None]
    tgt_pad = torch.arange(4)[None] >= torch.tensor([4, 3, 1])[:, None]
    expected = ref(
        src,
        tgt,
        tgt_mask=torch.ones(4, 4, dtype=torch.bool).triu(1),
        src_key_padding_mask=src_pad,
        tgt_key_padding_mask=tgt_pad,
        memory_key_padding_mask=src_pad,
    )
    memory = encoder(src, key_padding_mask=src_pad)
    out = decoder(tgt, memory, key_padding_mask=tgt_pad, memory_padding_mask=src_pad)
    keep = ~tgt_pad
    torch.testing.assert_close(out[keep], expected[keep], atol=1e-5, rtol=0)
