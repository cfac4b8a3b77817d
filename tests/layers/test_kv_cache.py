"""The static cache: every layer's buffers allocated at once, written in place, and reordered in place."""

from __future__ import annotations

import torch

from qkv.layers.attention import MultiHeadAttention
from qkv.layers.kv_cache import KVCache, LayerKVCache


def test_allocate_makes_one_zeroed_buffer_that_the_layers_view() -> None:
    cache = KVCache(n_layers=3, max_len=10)
    buffer = cache.allocate(2, 4, 8, dtype=torch.float64, device=torch.device("cpu"))
    assert buffer.shape == (3, 2, 2, 4, 10, 8) and buffer.dtype == torch.float64
    assert not buffer.any()
    keys, values = torch.randn(2, 4, 3, 8, dtype=torch.float64), torch.randn(2, 4, 3, 8, dtype=torch.float64)
    cache.self_attention[1].store(keys, values)
    torch.testing.assert_close(buffer[1, :, 0, :, :3], keys)
    torch.testing.assert_close(buffer[1, :, 1, :, :3], values)
    assert cache.length == 0 and cache.self_attention[1].length == 3  # layer 0 decides the model's length
    cache.length = 3
    assert all(layer.length == 3 for layer in cache.self_attention)


def test_attention_with_an_allocated_cache_equals_full_recomputation() -> None:
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 4)
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        full, _ = attention(x, causal=True)
        cache = KVCache(n_layers=1, max_len=8)
        cache.allocate(2, 4, 4, dtype=torch.float32, device=torch.device("cpu"))
        pieces = [attention(x[:, :3], causal=True, cache=cache.self_attention[0])[0]]
        pieces += [attention(x[:, t : t + 1], causal=True, cache=cache.self_attention[0])[0] for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-6, rtol=0)


def test_reorder_follows_the_rows_in_place() -> None:
    cache = KVCache(n_layers=2, max_len=6, cross_attention=True)
    buffer = cache.allocate(3, 2, 4, dtype=torch.float32, device=torch.device("cpu"))
    rows = torch.arange(3.0)[:, None, None, None].expand(3, 2, 4, 4)  # row i holds the value i
    for self_cache, cross_cache in zip(cache.self_attention, cache.cross_attention, strict=True):
        self_cache.store(rows, rows + 10)
        cross_cache.store(rows, rows, static=True)
    index = torch.tensor([2, 2, 0])
    pointer = buffer.data_ptr()
    cache.reorder(index, cross_attention=False)
    assert cache.buffer is buffer and buffer.data_ptr() == pointer
    for layer in cache.self_attention:
        assert layer.keys[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]
        assert layer.values[:, 0, 0, 0].tolist() == [12.0, 12.0, 10.0]
    assert cache.cross_attention[0].keys[:, 0, 0, 0].tolist() == [0.0, 1.0, 2.0]  # left alone
    cache.reorder(index)
    assert cache.cross_attention[0].keys[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]
    assert buffer[..., 4:, :].abs().sum() == 0  # positions not filled yet are not touched


def test_a_lazily_made_layer_cache_reorders_in_place_too() -> None:
    cache = LayerKVCache(max_len=4)
    rows = torch.arange(2.0)[:, None, None, None].expand(2, 1, 2, 3)
    cache.store(rows, rows)
    buffer = cache._keys
    cache.reorder(torch.tensor([1, 1]))
    assert cache._keys is buffer and cache.keys[:, 0, 0, 0].tolist() == [1.0, 1.0]
    cache.reorder(torch.tensor([0]))  # fewer rows: new buffers
    assert cache.keys.shape[0] == 1
