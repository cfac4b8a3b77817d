"""Positional encodings: the paper's formula, learned positions, rotary relative-position property."""

from __future__ import annotations

import math

import torch

from qkv.layers.positional import RotaryEmbedding, apply_rotary, sinusoidal_table


def test_sinusoidal_table_is_the_paper_formula() -> None:
    table = sinusoidal_table(50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert math.isclose(table[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(table[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-6)


def test_sinusoidal_non_interleaved_layout_is_a_column_permutation() -> None:
    a, b = sinusoidal_table(10, 8), sinusoidal_table(10, 8, interleaved=False)
    torch.testing.assert_close(b, torch.cat([a[:, 0::2], a[:, 1::2]], dim=1))


def test_rotary_scores_depend_only_on_relative_position() -> None:
    rope = RotaryEmbedding(64, 8)
    q, k = torch.randn(8), torch.randn(8)
    cos, sin = rope(64)

    def score(i: int, j: int) -> float:
        return (apply_rotary(q, cos[i], sin[i]) @ apply_rotary(k, cos[j], sin[j])).item()

    assert math.isclose(score(3, 1), score(40, 38), rel_tol=1e-4)
    assert math.isclose(score(0, 0), (q @ k).item(), rel_tol=1e-5)  # position 0: no rotation
    assert not math.isclose(score(3, 1), score(3, 2), rel_tol=1e-3)


def test_rotary_preserves_vector_length() -> None:
    rope = RotaryEmbedding(16, 6)
    x = torch.randn(2, 3, 16, 6)
    cos, sin = rope(16)
    torch.testing.assert_close(apply_rotary(x, cos, sin).norm(dim=-1), x.norm(dim=-1))


def test_rotary_gradient_is_the_rotation_back() -> None:
    """apply_rotary's hand-written backward agrees with finite differences and with autograd's formula."""
    cos, sin = (t.double() for t in RotaryEmbedding(10, 8)(10))
    x = torch.randn(2, 3, 10, 8, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: apply_rotary(t, cos, sin), (x,))
    first, second = x.chunk(2, dim=-1)
    plain = x * cos + torch.cat([-second, first], dim=-1) * sin  # the formula, differentiated by autograd
    grad = torch.randn_like(plain)
    (expected,) = torch.autograd.grad(plain, x, grad)
    (actual,) = torch.autograd.grad(apply_rotary(x, cos, sin), x, grad)
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(apply_rotary(x, cos, sin), plain)
