"""The int8 token embedding reads its rows from the unembedding's int8 matrix: same numbers as nn.Embedding
over the dequantized matrix, and one matrix for both."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from qkv.quantization.int8_embedding import Int8TokenEmbedding
from qkv.quantization.int8_linear import Int8Linear


def test_rows_are_the_dequantized_rows_of_the_shared_matrix() -> None:
    weight = torch.randn(30, 16)
    unembedding = Int8Linear.from_float(weight)
    embedding = Int8TokenEmbedding(unembedding)
    ids = torch.randint(0, 30, (3, 7))
    reference = torch.nn.Embedding.from_pretrained(unembedding.weight)  # torch's lookup on s * Q
    torch.testing.assert_close(embedding(ids), reference(ids))
    assert embedding(ids).shape == (3, 7, 16)
    assert float((embedding.weight - weight).abs().max()) <= float(unembedding.weight_scale.max()) / 2 + 1e-7


def test_the_matrix_is_shared_not_copied() -> None:
    unembedding = Int8Linear.from_float(torch.randn(12, 8))
    embedding = Int8TokenEmbedding(unembedding)
    assert embedding.qweight is unembedding.qweight and embedding.weight_scale is unembedding.weight_scale
    module = torch.nn.ModuleDict({"embedding": embedding, "unembedding": unembedding}).to(torch.float64)
    assert module["embedding"].weight_scale is module["unembedding"].weight_scale  # still one tensor
    assert embedding(torch.tensor([[1, 2]])).dtype == torch.float64


def test_scaled_embeddings_keep_their_factor() -> None:
    unembedding = Int8Linear.from_float(torch.randn(10, 64))
    ids = torch.tensor([[0, 3, 9]])
    scaled = Int8TokenEmbedding(unembedding, scale=math.sqrt(64))
    torch.testing.assert_close(scaled(ids), F.embedding(ids, unembedding.weight) * 8.0)


def test_a_grouped_matrix_gives_each_group_its_scale() -> None:
    weight = torch.randn(30, 96) * torch.rand(96).mul(4).exp()  # groups of very different sizes
    unembedding = Int8Linear.from_float(weight, group_size=32)
    embedding = Int8TokenEmbedding(unembedding, scale=2.0)
    assert embedding.weight_scale is unembedding.weight_scale and embedding.weight_scale.shape == (30, 3)
    ids = torch.randint(0, 30, (3, 7))
    assert torch.equal(embedding(ids), F.embedding(ids, unembedding.weight) * 2.0)  # torch's lookup on s Q
    assert torch.equal(embedding.weight, unembedding.weight) and "groups of 32" in repr(embedding)
