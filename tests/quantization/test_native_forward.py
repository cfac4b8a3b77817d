"""The bridge to forward.h: when the C library takes a tensor. (Its numbers are compared with PyTorch's in
test_activation_blocks, test_int4_linear and test_int8_linear, through the layers that call it.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv import native
from qkv.quantization import native_forward


def test_the_library_takes_cpu_tensors_outside_torch_compile(monkeypatch) -> None:
    if native.library() is None:
        pytest.skip(f"the C kernels are unavailable: {native.unavailable_reason()}")
    x = torch.randn(4, 32)
    assert native_forward.available(x, x.to(torch.int8))
    assert not native_forward.available(x, torch.empty(4, 32, device="meta"))  # one tensor elsewhere
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not native_forward.available(x)


def test_without_the_library_nothing_is_taken(monkeypatch) -> None:
    monkeypatch.setattr(native, "library", lambda name="decode_step": None)
    assert not native_forward.available(torch.randn(4, 32))


def test_a_w4a8_prompt_takes_the_decode_steps_product() -> None:
    """An int4 layer with int8 activations rounded once, on more than PROMPT_ROWS rows, computes the C step's
    product (integer sums exact: the float64 product of the rounded x), over several parts of 64 vectors and rows
    past the last 16; with x rounded twice, with fewer rows, or with a gradient to keep, PyTorch's road."""
    from qkv.decoding.native_step import lane_kernels, native_product
    from qkv.quantization import Int4Linear
    from qkv.quantization.activation_blocks import round_activations

    if native.library() is None or not lane_kernels():
        pytest.skip("no C kernel of 16 rows for this CPU: int4 prompts take PyTorch's GEMM")
    layer = Int4Linear.from_float(torch.randn(40, 96) * 0.05, torch.randn(40), group_size=32)
    layer.activations = "int8"
    rows = native_forward.PROMPT_ROWS * 2 + 12
    x = torch.randn(2, rows // 2, 96) * torch.rand(96) * 4
    with torch.no_grad():
        y = layer(x)
        assert y.shape == (2, rows // 2, 40)
        assert torch.equal(y.reshape(rows, 40), native_product(layer, x.reshape(rows, 96)))
        exact = F.linear(round_activations(x, "int8").double(), layer.weight.double(), layer.bias.double())
        assert (y.double() - exact).abs().max() <= 1e-5 * exact.abs().max()
        lanes = layer.lanes()
        assert layer.lanes() is lanes  # one copy, made once
        few = x[0, :8]
        assert not torch.equal(layer(few), native_product(layer, few))  # PyTorch's int4 kernel (bfloat16 x)
        layer.activations = "int8x2"
        twice = layer(x)
        layer.activations = "float"
        assert torch.equal(twice, layer(round_activations(x, "int8x2")))  # the widened W's GEMM of the rounded x
        layer.qweight[0, 0] ^= 0xFF  # the weights change: the copy is made again
        assert layer.lanes() is not lanes
    layer.activations = "int8"
    leaf = x.clone().requires_grad_()
    layer(leaf).sum().backward()
    assert leaf.grad is not None and leaf.grad.abs().sum() > 0
