"""Token embedding W_E (with the paper's sqrt(d_model) scaling), unembedding W_U, input embedding."""

from __future__ import annotations

import math

import torch

from qkv.layers.embedding import InputEmbedding, TokenEmbedding, Unembedding
from qkv.layers.positional import sinusoidal_table
from qkv.models import GPT, GPTConfig, next_token_distribution
from qkv.models.next_token import next_token_logits


def test_embedding_is_a_row_lookup_optionally_scaled() -> None:
    plain, scaled = TokenEmbedding(10, 16), TokenEmbedding(10, 16, scale=True)
    scaled.weight.data.copy_(plain.weight.data)
    ids = torch.tensor([[3, 3, 7]])
    torch.testing.assert_close(plain(ids)[0, 0], plain.weight[3])
    torch.testing.assert_close(scaled(ids), plain(ids) * math.sqrt(16))


def test_unembedding_scores_every_token_with_a_dot_product() -> None:
    embedding = TokenEmbedding(10, 4)
    tied = Unembedding(4, 10, tied_to=embedding)
    x = torch.randn(4)
    torch.testing.assert_close(tied(x), torch.stack([x @ embedding.weight[i] for i in range(10)]))
    separate = Unembedding(4, 10, bias=True)
    assert separate.weight is not embedding.weight and separate.bias.shape == (10,)


def test_input_embedding_adds_positions_to_tokens() -> None:
    layer = InputEmbedding(10, 8, 20, positional="sinusoidal")
    ids = torch.tensor([[1, 2, 3]])
    expected = layer.token_embedding(ids) + sinusoidal_table(20, 8)[4:7]
    torch.testing.assert_close(layer(ids, start=4), expected)
    assert InputEmbedding(10, 8, 20, positional="rope").positional_encoding is None


def test_next_token_distribution_is_softmax_of_the_last_logits() -> None:
    model = GPT(GPTConfig(vocab_size=20, d_model=16, n_heads=2, n_layers=1, context_length=8))
    ids = [1, 5, 9]
    logits = model.eval()(torch.tensor([ids]))[0, -1]
    torch.testing.assert_close(next_token_logits(model, ids), logits)
    for t in (0.5, 1.0, 2.0):
        torch.testing.assert_close(next_token_distribution(model, ids, t), torch.softmax(logits / t, -1))
