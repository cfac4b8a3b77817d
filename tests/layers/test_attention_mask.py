"""attention_mask, the one mask every attention path uses: causal, a causal sliding window, given masks and
padding, each against a mask written out position by position; and a windowed MultiHeadAttention's paths
(fast, explicit, KV cache) against attention computed with that loop's mask."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.layers.attention import MultiHeadAttention, attention_mask, causal_mask
from qkv.layers.kv_cache import LayerKVCache

TOL = 1e-5


def loop_mask(query_positions: list[int], n_keys: int, *, causal: bool, window: int | None) -> torch.Tensor:
    """(Tq, Tk) written out: query at position p sees key j iff j <= p (causal) and p - window < j (window)."""
    rows = []
    for p in query_positions:
        row = []
        for j in range(n_keys):
            sees = True
            if causal or window is not None:
                sees = j <= p
            if window is not None:
                sees = sees and j > p - window
            row.append(sees)
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool).reshape(len(query_positions), n_keys)


@settings(max_examples=60, deadline=None)
@given(n_keys=st.integers(1, 12), data=st.data())
def test_the_mask_equals_the_loop(n_keys: int, data: st.DataObject) -> None:
    n_queries = data.draw(st.integers(1, n_keys))
    causal = data.draw(st.booleans())
    window = data.draw(st.one_of(st.none(), st.integers(1, 14)))
    mask = attention_mask(n_queries, n_keys, causal=causal, window=window)
    if not causal and window is None:
        assert mask is None  # nothing to hide
        return
    last = list(range(n_keys - n_queries, n_keys))  # the default: the last Tq positions
    assert torch.equal(mask, loop_mask(last, n_keys, causal=causal, window=window))


def test_a_query_at_p_sees_the_keys_from_p_minus_window_plus_one_to_p() -> None:
    mask = attention_mask(6, causal=True, window=3)
    assert mask.int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 1, 1, 1],
    ]
    assert torch.equal(attention_mask(2, 5, causal=True), causal_mask(2, 5))  # the last two of five positions
    assert torch.equal(attention_mask(4, window=2), attention_mask(4, causal=True, window=2))  # a window is causal


def test_a_position_per_row_as_the_decode_step_has() -> None:
    positions = torch.tensor([[4], [1], [7]])  # (B, 1): each row's one new token
    mask = attention_mask(1, 8, causal=True, window=3, query_positions=positions)
    assert mask.shape == (3, 1, 1, 8)
    for row, p in enumerate(positions[:, 0].tolist()):
        assert torch.equal(mask[row, 0], loop_mask([p], 8, causal=True, window=3))
    shared = attention_mask(2, 8, causal=True, query_positions=torch.tensor([3, 6]))  # (Tq,): one set for all
    assert torch.equal(shared, loop_mask([3, 6], 8, causal=True, window=None))


def test_given_masks_and_padding_combine_with_the_window() -> None:
    padding = torch.tensor([[False] * 5, [False, False, False, True, True]])  # (B, Tk): row 1 has 3 tokens
    extra = torch.ones(5, 5, dtype=torch.bool)
    extra[:, 0] = False  # nobody sees key 0
    mask = attention_mask(5, causal=True, window=2, attn_mask=extra, key_padding_mask=padding)
    assert mask.shape == (2, 1, 5, 5)
    expected = loop_mask(list(range(5)), 5, causal=True, window=2) & extra
    assert torch.equal(mask[0, 0], expected)
    assert torch.equal(mask[1, 0], expected & ~padding[1])


@pytest.mark.parametrize("window", [0, -2, True])
def test_a_window_must_be_a_positive_count(window: int) -> None:
    with pytest.raises(ValueError, match="window="):
        attention_mask(4, causal=True, window=window)
    with pytest.raises(ValueError, match="window="):
        MultiHeadAttention(16, 4, window=window)


def reference_attention(attention: MultiHeadAttention, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d_k)) V with ``mask`` (Tq, Tk) from the loop, written with the module's weights."""
    batch, length, _ = x.shape
    heads, d_k = attention.n_heads, attention.head_dim
    q = attention.query(x).view(batch, length, heads, d_k).transpose(1, 2)
    k = attention.key(x).view(batch, length, attention.n_kv_heads, d_k).transpose(1, 2)
    v = attention.value(x).view(batch, length, attention.n_kv_heads, d_k).transpose(1, 2)
    k, v = k.repeat_interleave(attention.group, dim=1), v.repeat_interleave(attention.group, dim=1)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(d_k)).masked_fill(~mask, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # (B, h, T, d_k)
    return attention.out_proj(out.transpose(1, 2).reshape(batch, length, -1))


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_windowed_attention_paths_equal_the_loop(n_kv_heads: int) -> None:
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 4, n_kv_heads=n_kv_heads, window=3).eval()
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        expected = reference_attention(attention, x, loop_mask(list(range(9)), 9, causal=True, window=3))
        fast, _ = attention(x, causal=True)
        explicit, weights = attention(x, causal=True, need_weights=True)
    torch.testing.assert_close(fast, expected, atol=TOL, rtol=0)
    torch.testing.assert_close(explicit, expected, atol=TOL, rtol=0)
    assert (weights[:, :, 5, :3] == 0).all() and (weights[:, :, 5, 3:6] > 0).all()  # position 5 sees 3, 4, 5
    with torch.no_grad():  # a sequence no longer than the window: plain causal attention
        short, _ = attention(x[:, :3], causal=True)
    torch.testing.assert_close(short, expected[:, :3], atol=TOL, rtol=0)


@settings(max_examples=20, deadline=None)
@given(n_prefix=st.integers(1, 6), n_steps=st.integers(1, 6), chunk=st.integers(1, 3), window=st.integers(1, 5))
def test_windowed_kv_cache_equals_full_recomputation(n_prefix: int, n_steps: int, chunk: int, window: int) -> None:
    """Feeding a sequence piece by piece through the cache slides the window as one pass over it does."""
    torch.manual_seed(n_prefix * 100 + n_steps * 10 + window)
    attention = MultiHeadAttention(16, 4, n_kv_heads=2, window=window).eval()
    x = torch.randn(2, n_prefix + n_steps, 16)
    with torch.no_grad():
        full, _ = attention(x, causal=True)
        cache = LayerKVCache(max_len=32)
        pieces = [attention(x[:, :n_prefix], causal=True, cache=cache)[0]]
        for start in range(n_prefix, n_prefix + n_steps, chunk):
            pieces.append(attention(x[:, start : start + chunk], causal=True, cache=cache)[0])
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=TOL, rtol=0)


def test_the_window_leaves_cross_and_bidirectional_attention_alone() -> None:
    torch.manual_seed(1)
    windowed, plain = MultiHeadAttention(16, 4, window=2), MultiHeadAttention(16, 4)
    plain.load_state_dict(windowed.state_dict())
    x, memory = torch.randn(2, 6, 16), torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(windowed(x)[0], plain(x)[0])  # not causal: no window
        torch.testing.assert_close(windowed(x, memory)[0], plain(x, memory)[0])
