"""The C library's rotary embedding and its gradient against the rotation written out in float64 with PyTorch, and
where ``apply_rotary`` hands it its work."""

from __future__ import annotations

import pytest
import torch

from qkv import native
from qkv.layers import positional
from qkv.layers.positional import RotaryEmbedding, apply_rotary
from qkv.native import rotary as native_rotary

pytestmark = pytest.mark.skipif(
    native.library() is None or not native_rotary.built(), reason="no native library with AVX-512: PyTorch computes it"
)


@pytest.fixture
def any_size(monkeypatch) -> None:
    monkeypatch.setattr(native_rotary, "MIN_ELEMENTS", 0)


def written_out(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x cos + rotate_half(x) sin, as Hugging Face writes it: rotate_half(x) = [-x2, x1]."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


@pytest.mark.parametrize(
    ("batch", "heads", "length", "d"), [(1, 1, 1, 2), (2, 3, 5, 6), (2, 9, 17, 64), (1, 2, 40, 40)]
)
@pytest.mark.parametrize("split", [True, False])
def test_the_rotation_and_its_gradient_are_pytorchs(
    batch, heads, length, d, split: bool, monkeypatch, any_size
) -> None:
    """``split``: the heads are a view of a projection's output (B, T, h d), as attention makes them; otherwise a
    contiguous (B, h, T, d). The output and the gradient keep the input's layout."""
    torch.manual_seed(0)
    cos, sin = RotaryEmbedding(64, d, base=100.0)(length, start=3)
    if split:
        projected = torch.randn(batch, length, heads * d, requires_grad=True)
        x = projected.view(batch, length, heads, d).transpose(1, 2)
    else:
        projected = torch.randn(batch, heads, length, d, requires_grad=True)
        x = projected
    calls = []
    real = native_rotary.rotate
    monkeypatch.setattr(positional.native_rotary, "rotate", lambda *a: calls.append(1) or real(*a))
    out = apply_rotary(x, cos, sin)
    assert calls and out.stride() == x.stride()
    grad = torch.randn(out.shape)
    (mine,) = torch.autograd.grad(out, (projected,), grad)
    wide = projected.detach().double().requires_grad_()
    wide_x = wide.view(batch, length, heads, d).transpose(1, 2) if split else wide
    reference = written_out(wide_x, cos.double(), sin.double())
    (theirs,) = torch.autograd.grad(reference, (wide,), grad.double())
    assert torch.allclose(out.double(), reference, atol=1e-6, rtol=1e-6)
    assert mine.is_contiguous() and torch.allclose(mine.double(), theirs, atol=1e-6, rtol=1e-6)


def test_what_it_does_not_take_stays_with_pytorch(monkeypatch) -> None:
    cos, sin = RotaryEmbedding(16, 8)(16)
    x = torch.randn(1, 2, 16, 8)
    assert not native_rotary.applies(x, cos, sin)  # a decoding step's few rows
    monkeypatch.setattr(native_rotary, "MIN_ELEMENTS", 0)
    assert native_rotary.applies(x, cos, sin)
    assert not native_rotary.applies(x.double(), cos.double(), sin.double())
    assert not native_rotary.applies(x[..., :7], cos[:, :7], sin[:, :7])  # an odd width
    assert not native_rotary.applies(x.transpose(-1, -2).contiguous().transpose(-1, -2), cos, sin)  # rows strided
    assert not native_rotary.applies(x, cos[None, None], sin[None, None])  # tables per sequence: PyTorch's broadcast
    assert not native_rotary.applies(x[0], cos, sin)


def test_without_a_gradient_pytorch_rotates(monkeypatch, any_size) -> None:
    monkeypatch.setattr(native_rotary, "rotate", lambda *a: pytest.fail("no gradient is wanted"))
    cos, sin = RotaryEmbedding(16, 8)(16)
    x = torch.randn(1, 2, 16, 8, requires_grad=True)
    with torch.no_grad():
        assert torch.allclose(apply_rotary(x, cos, sin), written_out(x, cos, sin), atol=1e-6)


def test_a_second_derivative_is_refused_not_zero(any_size) -> None:
    cos, sin = RotaryEmbedding(16, 8)(16)
    x = torch.randn(1, 2, 16, 8, requires_grad=True)
    (dx,) = torch.autograd.grad(apply_rotary(x, cos, sin).pow(2).sum(), (x,), create_graph=True)
    with pytest.raises(RuntimeError):
        dx.sum().backward()
