"""SwiGLU's gate, silu(g) * u, and its gradients in the C library (``swiglu.h`` beside this file): one pass over the
rows each way instead of PyTorch's five, and two saved tensors (g, u) instead of three.

:func:`applies` says whether the library takes the tensors: float32 CPU tensors of one shape, contiguous, of at least
:data:`MIN_ELEMENTS` numbers, outside torch.compile (whose own code generation fuses the same pass), with the library
built for AVX-512. The numbers are PyTorch's up to float32 rounding (its e^x within 3 units in the last place).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from qkv.native.kernels import built, call, pointer

# Fewer numbers (a decoding step's few rows) stay with PyTorch, whose two operators cost less than a call into the
# library: one row of 1,536 took 3.3 us against 11.9, 64 rows 33 us against 29 (2 threads).
MIN_ELEMENTS = 1 << 16


def applies(gate: Tensor, up: Tensor) -> bool:
    """Whether :func:`swiglu` computes silu(gate) * up in C."""
    return (
        gate.dtype == up.dtype == torch.float32
        and gate.device.type == up.device.type == "cpu"
        and gate.shape == up.shape
        and gate.numel() >= MIN_ELEMENTS
        and gate.is_contiguous()
        and up.is_contiguous()
        and not torch.compiler.is_compiling()
        and built()
    )


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up, differentiable in both (see :func:`applies` for what it takes)."""
    return SwiGLU.apply(gate, up)


def _call(name: str, *tensors: Tensor) -> None:
    pointers = [pointer(t) for t in tensors]
    call(name, name, *pointers, ctypes.c_int64(tensors[0].numel()), ctypes.c_int32(torch.get_num_threads()))


class SwiGLU(torch.autograd.Function):
    """h = silu(g) u; the backward pass gives dL/dg = dh u s (1 + g (1 - s)) and dL/du = dh g s, s = sigmoid(g)."""

    @staticmethod
    def forward(ctx, gate, up):  # noqa: ANN001, ANN205
        out = torch.empty_like(gate)
        _call("qkv_swiglu", gate.detach(), up.detach(), out)
        ctx.save_for_backward(gate, up)
        return out

    @staticmethod
    @once_differentiable  # the C call is not itself differentiable: a second derivative is refused, not zero
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        gate, up = ctx.saved_tensors
        grad_gate, grad_up = torch.empty_like(gate), torch.empty_like(up)
        _call("qkv_swiglu_backward", gate, up, grad.contiguous(), grad_gate, grad_up)
        return grad_gate, grad_up
