"""The C library's SwiGLU gate, silu(g) * u, and its gradients against PyTorch's in float64, and where the gated
feed-forward hands it its work."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv import native
from qkv.layers.feedforward import GatedFeedForward
from qkv.native import swiglu as native_swiglu

pytestmark = pytest.mark.skipif(
    native.library() is None or not native_swiglu.built(), reason="no native library with AVX-512: PyTorch computes it"
)


@pytest.fixture
def any_size(monkeypatch) -> None:
    monkeypatch.setattr(native_swiglu, "MIN_ELEMENTS", 0)


@pytest.mark.parametrize("shape", [(1,), (15,), (16,), (3, 7, 37), (4, 64, 1536)])
def test_the_gate_and_its_gradients_are_pytorchs(shape: tuple[int, ...], any_size) -> None:
    torch.manual_seed(0)
    gate = (torch.randn(shape) * 4).requires_grad_()
    with torch.no_grad():  # the tails of the sigmoid, and zero
        gate.view(-1)[:4] = torch.tensor([-100.0, 100.0, 0.0, -88.5])[: gate.numel()]
    up = torch.randn(shape, requires_grad=True)
    assert native_swiglu.applies(gate, up)
    out = native_swiglu.swiglu(gate, up)
    grad = torch.randn(shape)
    mine = torch.autograd.grad(out, (gate, up), grad)
    wide = [t.detach().double().requires_grad_() for t in (gate, up)]
    reference = F.silu(wide[0]) * wide[1]
    theirs = torch.autograd.grad(reference, wide, grad.double())
    assert out.shape == shape and out.dtype == torch.float32
    assert torch.allclose(out.double(), reference, atol=1e-6, rtol=1e-6)
    for got, want in zip(mine, theirs, strict=True):
        assert torch.allclose(got.double(), want, atol=1e-6, rtol=1e-6), (got.double() - want).abs().max()


def test_what_it_does_not_take_stays_with_pytorch(monkeypatch) -> None:
    g, u = torch.randn(4, 32), torch.randn(4, 32)
    assert not native_swiglu.applies(g, u)  # a decoding step's few rows
    monkeypatch.setattr(native_swiglu, "MIN_ELEMENTS", 128)
    assert native_swiglu.applies(g, u)
    assert not native_swiglu.applies(g.double(), u.double())
    assert not native_swiglu.applies(g.bfloat16(), u.bfloat16())
    assert not native_swiglu.applies(g.T, u.T)  # not contiguous
    assert not native_swiglu.applies(g, u[:2])  # two shapes


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_the_gated_feed_forward_takes_it_and_gets_pytorchs_numbers(monkeypatch, dropout: float, any_size) -> None:
    """A SwiGLU feed-forward in training: the gate goes through the kernel, and the output and every gradient are
    those of PyTorch's road (the kernel refused); dropout still acts on the gated product."""
    torch.manual_seed(0)
    layer = GatedFeedForward(32, 96, activation="silu", dropout=dropout)
    x = torch.randn(2, 10, 32, requires_grad=True)
    calls = []
    real = native_swiglu.swiglu
    monkeypatch.setattr(native_swiglu, "swiglu", lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(1)
    ours = layer(x)
    ours.pow(2).sum().backward()
    mine = [x.grad.clone(), *(p.grad.clone() for p in layer.parameters())]
    assert calls
    x.grad = None
    layer.zero_grad()
    monkeypatch.setattr(native_swiglu, "applies", lambda *a: False)
    torch.manual_seed(1)
    theirs = layer(x)
    theirs.pow(2).sum().backward()
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-5)
    for got, want in zip(mine, [x.grad, *(p.grad for p in layer.parameters())], strict=True):
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


def test_other_activations_keep_pytorchs_road(monkeypatch, any_size) -> None:
    calls = []
    monkeypatch.setattr(native_swiglu, "swiglu", lambda *a: calls.append(1))
    layer = GatedFeedForward(16, 32, activation="gelu")
    out = layer(torch.randn(3, 16))
    assert not calls and out.shape == (3, 16)


def test_a_second_derivative_is_refused_not_zero(any_size) -> None:
    g, u = torch.randn(3, 16, requires_grad=True), torch.randn(3, 16, requires_grad=True)
    (dg,) = torch.autograd.grad(native_swiglu.swiglu(g, u).sum(), (g,), create_graph=True)
    with pytest.raises(RuntimeError):
        dg.sum().backward()
