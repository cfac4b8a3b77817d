"""The bridge to forward.h: when the C library takes a tensor. (Its numbers are compared with PyTorch's in
test_activation_blocks, test_int4_linear and test_int8_linear, through the layers that call it.)"""

from __future__ import annotations

import pytest
import torch

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
