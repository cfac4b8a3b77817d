"""Grouped-query attention (n_kv_heads < n_heads) against a reference built from PyTorch's
``F.scaled_dot_product_attention`` with each key/value head repeated for its query heads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv.layers.attention import MultiHeadAttention
from qkv.layers.capture import capture
from qkv.layers.kv_cache import KVCache, LayerKVCache
from qkv.layers.positional import RotaryEmbedding

TOL = 1e-5
D_MODEL, N_HEADS, D_K = 32, 4, 8


def reference(attn: MultiHeadAttention, x: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's attention over keys and values repeat_interleave'd to one per query head; and the weights."""
    batch, length, _ = x.shape
    group = attn.n_heads // attn.n_kv_heads
    q = F.linear(x, attn.query.weight, attn.query.bias).view(batch, length, N_HEADS, D_K).transpose(1, 2)
    k = F.linear(x, attn.key.weight, attn.key.bias).view(batch, length, attn.n_kv_heads, D_K).transpose(1, 2)
    v = F.linear(x, attn.value.weight, attn.value.bias).view(batch, length, attn.n_kv_heads, D_K).transpose(1, 2)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, h, T, d_k)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    scores = q @ k.transpose(-2, -1) / D_K**0.5
    if causal:
        scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
    out = F.linear(out.transpose(1, 2).reshape(batch, length, D_MODEL), attn.out_proj.weight, attn.out_proj.bias)
    return out, scores.softmax(-1)


@pytest.mark.parametrize("n_kv_heads", [N_HEADS, 2, 1])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("qkv_bias", [False, True])
def test_grouped_query_attention_matches_repeated_keys_and_values(n_kv_heads: int, causal: bool, qkv_bias: bool):
    torch.manual_seed(n_kv_heads)
    attn = MultiHeadAttention(D_MODEL, N_HEADS, n_kv_heads=n_kv_heads, bias=False, qkv_bias=qkv_bias)
    assert attn.key.weight.shape == attn.value.weight.shape == (n_kv_heads * D_K, D_MODEL)
    assert (attn.query.bias is not None) == qkv_bias and attn.out_proj.bias is None
    x = torch.randn(2, 6, D_MODEL)
    expected, expected_weights = reference(attn, x, causal)
    fast, _ = attn(x, causal=causal)
    explicit, weights = attn(x, causal=causal, need_weights=True)
    torch.testing.assert_close(fast, expected, atol=TOL, rtol=0)
    torch.testing.assert_close(explicit, expected, atol=TOL, rtol=0)
    torch.testing.assert_close(weights, expected_weights, atol=TOL, rtol=0)  # (B, h, T, T): per query head


@pytest.mark.parametrize("n_kv_heads", [2, 1])
def test_training_projection_splits_by_widths_and_gives_the_same_gradients(n_kv_heads: int) -> None:
    """While training, W_q, W_k, W_v run stacked (widths d_model, kv_dim, kv_dim); without gradients one by one."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(D_MODEL, N_HEADS, n_kv_heads=n_kv_heads)
    x = torch.randn(2, 5, D_MODEL)
    out = attn(x, causal=True)[0]
    with torch.no_grad():
        torch.testing.assert_close(attn(x, causal=True)[0], out, atol=TOL, rtol=0)
    out.square().sum().backward()
    ours = [p.grad.clone() for p in (attn.key.weight, attn.value.weight, attn.query.weight)]
    attn.zero_grad()
    reference(attn, x, causal=True)[0].square().sum().backward()
    for mine, ref in zip(ours, (attn.key.weight.grad, attn.value.weight.grad, attn.query.weight.grad), strict=True):
        torch.testing.assert_close(mine, ref, atol=1e-4, rtol=0)


def test_multi_query_attention_has_one_key_value_head_and_per_query_head_captures() -> None:
    torch.manual_seed(0)
    attn = MultiHeadAttention(D_MODEL, N_HEADS, n_kv_heads=1)
    x = torch.randn(2, 5, D_MODEL)
    with capture(attn) as acts:
        out, _ = attn(x, causal=True)
    torch.testing.assert_close(out, reference(attn, x, causal=True)[0], atol=TOL, rtol=0)
    for name in ("q", "k", "v"):
        assert acts[name].shape == (2, N_HEADS, 5, D_K)
    assert acts["weights"].shape == (2, N_HEADS, 5, 5)
    for head in range(1, N_HEADS):  # one key/value head serves all the query heads
        torch.testing.assert_close(acts["k"][:, head], acts["k"][:, 0])


@pytest.mark.parametrize("n_kv_heads", [N_HEADS, 2, 1])
def test_the_cache_holds_n_kv_heads_and_incremental_decoding_equals_the_full_forward(n_kv_heads: int) -> None:
    torch.manual_seed(0)
    attn = MultiHeadAttention(D_MODEL, N_HEADS, n_kv_heads=n_kv_heads)
    rope = RotaryEmbedding(16, D_K)
    x = torch.randn(2, 7, D_MODEL)
    full, _ = attn(x, causal=True, rotary=rope(7))
    for cache in (LayerKVCache(max_len=16), KVCache(1, 16)):
        if isinstance(cache, KVCache):
            buffer = cache.allocate(2, n_kv_heads, D_K, dtype=x.dtype, device=x.device)
            assert buffer.shape == (1, 2, 2, n_kv_heads, 16, D_K)
            cache = cache.self_attention[0]
        pieces = [attn(x[:, :3], causal=True, cache=cache, rotary=rope(3))[0]]
        for t in range(3, 7):
            pieces.append(attn(x[:, t : t + 1], causal=True, cache=cache, rotary=rope(1, t))[0])
        assert cache.keys.shape == cache.values.shape == (2, n_kv_heads, 7, D_K)
        torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=TOL, rtol=0)


def test_n_kv_heads_must_divide_n_heads() -> None:
    with pytest.raises(ValueError, match="n_kv_heads=3"):
        MultiHeadAttention(D_MODEL, N_HEADS, n_kv_heads=3)
