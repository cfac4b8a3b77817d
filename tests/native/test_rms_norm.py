"""The C library's RMSNorm and its gradients against PyTorch's ``F.rms_norm`` in float64, and where qkv's RMSNorm
module hands it its work."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qkv import native
from qkv.layers.norm import RMSNorm, make_norm
from qkv.native import rms_norm as native_rms_norm

pytestmark = pytest.mark.skipif(
    native.library() is None or not native_rms_norm.built(),
    reason="no native library with AVX-512: PyTorch computes it",
)


@pytest.fixture
def any_size(monkeypatch) -> None:
    monkeypatch.setattr(native_rms_norm, "MIN_ELEMENTS", 0)


CASES = [((1, 1), True), ((5, 15), True), ((3, 16), False), ((2, 7, 37), True), ((4, 256, 576), True), ((9, 0), True)]


@pytest.mark.parametrize(("shape", "gain"), CASES)
@pytest.mark.parametrize("wanted", ["x", "gain", "both"])
def test_the_norm_and_its_gradients_are_pytorchs(shape: tuple[int, ...], gain: bool, wanted: str, any_size) -> None:
    torch.manual_seed(0)
    d = shape[-1]
    x = (torch.randn(shape) * 3).requires_grad_(wanted != "gain")
    weight = torch.randn(d).requires_grad_(wanted != "x") if gain else None
    if not x.requires_grad and (weight is None or not weight.requires_grad):
        pytest.skip("nothing takes a gradient")
    assert native_rms_norm.applies(x, weight)
    out = native_rms_norm.rms_norm(x, weight, 1e-5)
    grad = torch.randn(shape)
    inputs = [t for t in (x, weight) if t is not None and t.requires_grad]
    mine = torch.autograd.grad(out, inputs, grad) if out.numel() else [torch.zeros_like(t) for t in inputs]
    wide = [t.detach().double().requires_grad_(t.requires_grad) if t is not None else None for t in (x, weight)]
    reference = F.rms_norm(wide[0], (d,), wide[1], 1e-5)
    wide_inputs = [t for t in wide if t is not None and t.requires_grad]
    theirs = torch.autograd.grad(reference, wide_inputs, grad.double()) if out.numel() else mine
    assert out.shape == shape and out.dtype == torch.float32
    assert torch.allclose(out.double(), reference, atol=1e-5, rtol=1e-5)
    for got, want in zip(mine, theirs, strict=True):
        assert got.shape == want.shape
        assert torch.allclose(got.double(), want.double(), atol=1e-4, rtol=1e-4), (got.double() - want).abs().max()


def test_what_it_does_not_take_stays_with_pytorch(monkeypatch) -> None:
    x, w = torch.randn(4, 32), torch.randn(32)
    assert not native_rms_norm.applies(x, w)  # a decoding step's few rows
    monkeypatch.setattr(native_rms_norm, "MIN_ELEMENTS", 64)
    assert native_rms_norm.applies(x, w) and native_rms_norm.applies(x, None)
    assert not native_rms_norm.applies(x.double(), w.double())
    assert not native_rms_norm.applies(x.bfloat16(), w)
    assert not native_rms_norm.applies(x.T, w)  # rows not contiguous
    assert not native_rms_norm.applies(x, w.bfloat16())


@pytest.mark.parametrize("affine", [True, False])
def test_the_module_takes_it_in_training_and_gets_pytorchs_numbers(monkeypatch, affine: bool, any_size) -> None:
    """qkv's RMSNorm (an nn.RMSNorm) in training: the kernel's output and gradients are nn.RMSNorm's own; eps None
    means the dtype's epsilon, as in PyTorch; without a gradient PyTorch's forward runs."""
    torch.manual_seed(0)
    norm = RMSNorm(48, elementwise_affine=affine)
    assert isinstance(norm, nn.RMSNorm)
    if affine:
        with torch.no_grad():
            norm.weight.normal_()
    x = torch.randn(3, 11, 48, requires_grad=True)
    calls = []
    real = native_rms_norm.rms_norm
    monkeypatch.setattr(native_rms_norm, "rms_norm", lambda *a: calls.append(a[2]) or real(*a))
    ours = norm(x)
    ours.pow(2).sum().backward()
    mine = [x.grad.clone(), *(p.grad.clone() for p in norm.parameters())]
    assert calls == [torch.finfo(torch.float32).eps]
    x.grad = None
    norm.zero_grad()
    theirs = nn.RMSNorm.forward(norm, x)
    theirs.pow(2).sum().backward()
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-5)
    for got, want in zip(mine, [x.grad, *(p.grad for p in norm.parameters())], strict=True):
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        norm(x)
    assert len(calls) == 1


def test_configs_asking_for_rmsnorm_get_this_module() -> None:
    class Config:
        d_model, norm, layer_norm_eps, bias = 8, "rmsnorm", 1e-6, False

    norm = make_norm(Config())
    assert type(norm) is RMSNorm and norm.eps == 1e-6
    assert set(norm.state_dict()) == set(nn.RMSNorm(8).state_dict())


def test_a_second_derivative_is_refused_not_zero(any_size) -> None:
    x = torch.randn(3, 16, requires_grad=True)
    (dx,) = torch.autograd.grad(
        native_rms_norm.rms_norm(x, torch.randn(16), 1e-5).pow(2).sum(), (x,), create_graph=True
    )
    with pytest.raises(RuntimeError):
        dx.sum().backward()
