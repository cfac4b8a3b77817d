"""RMSNorm, y = x / sqrt(mean(x^2) + eps) * g, with its gradients in the C library (``rms_norm.h`` beside this file):
the backward pass in one read of x and dL/dy per row, where PyTorch's takes about eight operators over the whole
tensor (its forward pass is already one).

:func:`applies` says whether the library takes the tensors: a float32 CPU tensor with contiguous rows over the last
dimension only, of at least :data:`MIN_ELEMENTS` numbers, a float32 gain or none, outside torch.compile (whose code
generation fuses the same passes), with the library built for AVX-512. The numbers are PyTorch's up to float32
rounding.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from qkv.native.kernels import built, call, pointer

MIN_ELEMENTS = 1 << 14  # fewer numbers (a decoding step's rows) cost less in PyTorch than a call into the library


def applies(x: Tensor, weight: Tensor | None) -> bool:
    """Whether :func:`rms_norm` normalizes x's rows in C."""
    return (
        x.dtype == torch.float32
        and x.device.type == "cpu"
        and x.dim() >= 1
        and x.numel() >= MIN_ELEMENTS
        and x.is_contiguous()
        and (weight is None or (weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.dim() == 1))
        and not torch.compiler.is_compiling()
        and built()
    )


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """RMSNorm over x's last dimension, differentiable in x and the gain (see :func:`applies` for what it takes)."""
    return RMSNorm.apply(x, weight, eps)


class RMSNorm(torch.autograd.Function):
    """y = (x r) g with r = 1 / sqrt(mean(x^2) + eps) per row; the forward pass keeps x and r, and the backward pass
    gives dL/dx = r (u - x r^2 mean(u x)) with u = dL/dy g, and dL/dg = the sum over rows of dL/dy x r."""

    @staticmethod
    def forward(ctx, x, weight, eps):  # noqa: ANN001, ANN205
        d = x.shape[-1]
        rows = x.numel() // d if d else 0
        gain = None if weight is None else weight.detach().contiguous()
        out, r = torch.empty_like(x), torch.empty(x.shape[:-1])
        if rows:
            call(
                "qkv_rms_norm", "RMSNorm", pointer(x), pointer(gain), pointer(out), pointer(r), ctypes.c_int64(rows),
                ctypes.c_int64(d), ctypes.c_float(eps), ctypes.c_int32(torch.get_num_threads()),
            )  # fmt: skip
        ctx.save_for_backward(x, gain, r)
        return out

    @staticmethod
    @once_differentiable  # the C call is not itself differentiable: a second derivative is refused, not zero
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        x, gain, r = ctx.saved_tensors
        want_x, want_gain = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        d = x.shape[-1]
        rows = x.numel() // d if d else 0
        threads = torch.get_num_threads()
        grad_x = torch.empty_like(x) if want_x else None
        parts = torch.zeros(threads, d) if want_gain else None
        if rows and (want_x or want_gain):
            grad = grad.contiguous()  # kept here while the library reads it
            call(
                "qkv_rms_norm_backward", "RMSNorm backward pass", pointer(x), pointer(gain), pointer(r), pointer(grad),
                pointer(grad_x), pointer(parts), ctypes.c_int64(rows), ctypes.c_int64(d), ctypes.c_int32(threads),
            )  # fmt: skip
        return grad_x, None if parts is None else parts.sum(0), None
