"""Rotary position embedding of queries or keys, and its gradient, in the C library (``rotary.h`` beside this file):
one pass each way where PyTorch takes four operators, reading and writing the heads in the layout the projection
left them in (so the gradient reaches the projection without a copy).

:func:`applies` says whether the library takes the tensors: float32 CPU queries or keys (B, h, T, d), d even, with
contiguous rows, of at least :data:`MIN_ELEMENTS` numbers, tables (T, d) of float32 with contiguous rows, outside
torch.compile, with the library built for AVX-512. The numbers are PyTorch's up to float32 rounding.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from qkv.native.kernels import built, call, pointer, strides

MIN_ELEMENTS = 1 << 14  # fewer numbers (a decoding step's rows) cost less in PyTorch than a call into the library


def applies(x: Tensor, cos: Tensor, sin_signed: Tensor) -> bool:
    """Whether :func:`rotate` rotates x in C."""
    return (
        x.dim() == 4
        and x.dtype == cos.dtype == sin_signed.dtype == torch.float32
        and x.device.type == cos.device.type == sin_signed.device.type == "cpu"
        and x.shape[-1] % 2 == 0
        and x.stride(-1) == 1
        and x.numel() >= MIN_ELEMENTS
        and cos.dim() == sin_signed.dim() == 2
        and cos.shape == sin_signed.shape == x.shape[-2:]
        and cos.stride() == sin_signed.stride()
        and cos.stride(-1) == 1
        and not torch.compiler.is_compiling()
        and built()
    )


def rotate(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """x cos + [x2, x1] sin_signed (halves swapped), differentiable in x (see :func:`applies` for what it takes)."""
    return Rotate.apply(x, cos, sin_signed)


def _rotate(x: Tensor, cos: Tensor, sin_signed: Tensor, backward: bool) -> Tensor:
    out = torch.empty_like(x)  # x's layout: the projection's, for heads split from one
    batch, heads, length, d = x.shape
    call(
        "qkv_rotary", "rotary embedding", pointer(x), strides(x)[0], pointer(cos), pointer(sin_signed),
        ctypes.c_int64(cos.stride(0)), pointer(out), strides(out)[0], ctypes.c_int64(batch), ctypes.c_int64(heads),
        ctypes.c_int64(length), ctypes.c_int64(d), ctypes.c_int32(int(backward)),
        ctypes.c_int32(torch.get_num_threads()),
    )  # fmt: skip
    return out


class Rotate(torch.autograd.Function):
    """y = x cos + [x2, x1] sin_signed; dL/dx is the rotation back, dy cos + [dy2 s2, dy1 s1] with s = sin_signed."""

    @staticmethod
    def forward(ctx, x, cos, sin_signed):  # noqa: ANN001, ANN205
        ctx.save_for_backward(cos, sin_signed)
        return _rotate(x.detach(), cos, sin_signed, backward=False)

    @staticmethod
    @once_differentiable  # the C call is not itself differentiable: a second derivative is refused, not zero
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        cos, sin_signed = ctx.saved_tensors
        grad = grad if grad.stride(-1) == 1 else grad.contiguous()
        return _rotate(grad, cos, sin_signed, backward=True), None, None
