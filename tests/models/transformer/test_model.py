"""The encoder-decoder model: cached decoding, padding, cross-attention reading the source."""

from __future__ import annotations

import torch

from qkv.layers.capture import capture
from qkv.models import Transformer, TransformerConfig


def tiny(**kw) -> Transformer:
    config = TransformerConfig(
        src_vocab_size=30,
        tgt_vocab_size=40,
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_encoder_layers=2,
        n_decoder_layers=2,
        context_length=32,
        norm_first=False,
        positional="sinusoidal",
        scale_embeddings=True,
        **kw,
    )
    return Transformer(config).eval()


def test_cached_decoding_equals_teacher_forced_logits() -> None:
    for positional in ("sinusoidal", "learned", "rope"):
        model = Transformer(tiny().config.replace(positional=positional)).eval()
        src, tgt = torch.randint(4, 30, (2, 7)), torch.randint(4, 40, (2, 6))
        with torch.no_grad():
            full = model(src, tgt)
            memory = model.encode(src)
            cache = model.new_cache()
            steps = [model.decode(tgt[:, i : i + 1], memory, cache=cache) for i in range(6)]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_source_padding_gives_the_same_outputs_as_one_by_one() -> None:
    model = tiny()
    sources = [[5, 6, 7, 8, 9], [10, 11]]
    src = torch.zeros(2, 5, dtype=torch.long)
    src_pad = torch.ones(2, 5, dtype=torch.bool)
    for i, s in enumerate(sources):
        src[i, : len(s)] = torch.tensor(s)
        src_pad[i, : len(s)] = False
    tgt = torch.randint(4, 40, (2, 4))
    with torch.no_grad():
        batched = model(src, tgt, src_padding_mask=src_pad)
        for i, s in enumerate(sources):
            alone = model(torch.tensor([s]), tgt[i : i + 1])
            torch.testing.assert_close(batched[i], alone[0], atol=1e-5, rtol=0)


def test_cross_attention_weights_cover_the_source_only() -> None:
    model = tiny()
    src, tgt = torch.randint(4, 30, (1, 5)), torch.randint(4, 40, (1, 3))
    src_pad = torch.tensor([[False, False, False, True, True]])
    with capture(model) as acts:
        model(src, tgt, src_padding_mask=src_pad)
    weights = acts["decoder.blocks.0.cross_attn.weights"]  # (B, h, T_tgt, T_src)
    assert weights.shape == (1, 4, 3, 5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 4, 3))
    assert torch.all(weights[..., 3:] == 0)
    self_weights = acts["decoder.blocks.0.self_attn.weights"]
    assert torch.all(self_weights.triu(1) == 0)


def test_shared_embeddings_are_one_matrix() -> None:
    config = tiny().config.replace(tgt_vocab_size=30, share_embeddings=True)
    model = Transformer(config)
    assert model.src_embedding.token_embedding is model.tgt_embedding.token_embedding
    assert model.unembedding.weight is model.tgt_embedding.token_embedding.weight
