"""The encoder-only model: bidirectional attention, padding-invariant pooling, segment embeddings."""

from __future__ import annotations

import torch

from qkv.models import Encoder, EncoderConfig, mean_pool


def tiny(**kw) -> Encoder:
    return Encoder(EncoderConfig(vocab_size=50, d_model=32, n_heads=4, n_layers=2, context_length=16, **kw)).eval()


def test_every_token_sees_the_future_too() -> None:
    model = tiny()
    a, b = torch.tensor([[5, 6, 7, 8]]), torch.tensor([[5, 6, 7, 9]])
    with torch.no_grad():
        assert not torch.allclose(model(a)[0, 0], model(b)[0, 0])  # unlike GPT, position 0 changes


def test_padded_batch_equals_one_by_one_and_pooling_ignores_padding() -> None:
    model = tiny(norm_first=False, embedding_norm=True, type_vocab_size=2)
    sentences = [[3, 4, 5, 6, 7, 8], [9, 10], [11, 12, 13]]
    ids = torch.zeros(3, 6, dtype=torch.long)
    pad = torch.ones(3, 6, dtype=torch.bool)
    for i, s in enumerate(sentences):
        ids[i, : len(s)], pad[i, : len(s)] = torch.tensor(s), False
    with torch.no_grad():
        hidden = model(ids, padding_mask=pad)
        pooled = model.embed(ids, padding_mask=pad)
        for i, s in enumerate(sentences):
            alone = model(torch.tensor([s]))
            torch.testing.assert_close(hidden[i, : len(s)], alone[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(pooled[i], alone[0].mean(0), atol=1e-5, rtol=0)


def test_mean_pool_by_hand() -> None:
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    pooled = mean_pool(hidden, torch.tensor([[False, False, True]]))
    assert pooled.tolist() == [[2.0, 3.0]]


def test_segment_embeddings_change_the_output() -> None:
    model = tiny(type_vocab_size=2)
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        a = model(ids, token_type_ids=torch.tensor([[0, 0, 0]]))
        b = model(ids, token_type_ids=torch.tensor([[0, 1, 1]]))
    torch.testing.assert_close(a, model(ids))  # default segment is 0
    assert not torch.allclose(a, b)
