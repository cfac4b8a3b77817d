"""The tensor rewrites between GGUF and qkv: llama.cpp's RoPE row order and GPT-2's fused attn_qkv."""

from __future__ import annotations

import torch

from qkv.gguf.names import cat_rows, rope_permute, rope_unpermute, split_rows
from qkv.layers.positional import apply_rotary


def test_rope_permutation_is_invertible_and_pairs_halves():
    w = torch.randn(3 * 8, 5)  # 3 heads of d_k = 8
    (back,) = rope_unpermute(3)(rope_permute(3)(w))
    assert torch.equal(back, w)
    permuted = rope_permute(3)(w)
    assert torch.equal(permuted[8:16:2], w[8:12]) and torch.equal(permuted[9:16:2], w[12:16])  # head 1 interleaved


def test_permuted_rows_with_pairwise_rope_equal_rotate_half():
    """What the permutation is for: llama.cpp's rotation of adjacent pairs of the permuted W_q x equals qkv's
    rotate-half rotation of W_q x, up to the same permutation of the output."""
    d, angle = 8, torch.rand(4)  # one head; 4 frequencies
    q = torch.randn(d)
    cos, sin = torch.cat([angle.cos()] * 2), torch.cat([angle.sin()] * 2)
    ours = apply_rotary(q[None], cos[None], sin[None])[0]
    pairs = rope_permute(1)(q[:, None])[:, 0].view(4, 2)  # (x_j, x_j+d/2) side by side
    rotated = torch.stack([pairs[:, 0] * angle.cos() - pairs[:, 1] * angle.sin(),
                           pairs[:, 0] * angle.sin() + pairs[:, 1] * angle.cos()], dim=1)  # fmt: skip
    (back,) = rope_unpermute(1)(rotated.reshape(d, 1))
    assert torch.allclose(back[:, 0], ours, atol=1e-6)


def test_fused_rows():
    q, k, v = torch.randn(6, 4), torch.randn(2, 4), torch.randn(2, 4)
    parts = split_rows(6, 2, 2)(cat_rows(q, k, v))
    assert all(torch.equal(a, b) for a, b in zip(parts, (q, k, v), strict=True))
