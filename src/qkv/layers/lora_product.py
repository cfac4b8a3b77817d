"""A LoRA layer's forward and backward passes in training as one autograd function, for a frozen float32 base that
oneDNN multiplies from packed copies (:func:`~qkv.layers.linear.packs`). With s = alpha / r, n rows x, W (d_out,
d_in), A (r, d_in), B (d_out, r), and g = dL/dy:

    low = x A^T  (n, r),                y = x W^T + b + s low B^T
    dL/dB = s g^T low,   glow = s g B  (n, r),   dL/dA = glow^T x,   dL/dx = g W + glow A

Autograd, given the same products one by one, computes dL/dA as x^T glow and s g B from B's (d_out, r) rows, orders
that MKL's GEMM runs 2-5 times slower for r = 8 than (glow^T x) and g times a row-major copy of B^T; it also adds g W
and glow A as two tensors. Here each product is taken in its fast order, and glow A is added into g W in place:
a LoRA layer over SmolLM2's 576 x 576 W_q at 1,024 rows took 8.5 ms forward and backward against 9.8.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from qkv.layers.linear import autocast_bfloat16, packed_product, packed_transposed_product, packs


def applies(x: Tensor, weight: Tensor, bias: Tensor | None, a: Tensor, b: Tensor) -> bool:
    """Whether :class:`LoRAProduct` computes this layer: float32 throughout, a frozen packable W (and b), the
    adapters on the CPU, a gradient wanted, no autocast."""
    return (
        torch.is_grad_enabled()
        and (a.requires_grad or b.requires_grad)
        and x.dtype == a.dtype == b.dtype == torch.float32
        and x.device.type == a.device.type == b.device.type == "cpu"
        and (bias is None or (not bias.requires_grad and bias.dtype == torch.float32))
        and not autocast_bfloat16(x)
        and not torch.compiler.is_compiling()
        and packs(weight)
    )


class LoRAProduct(torch.autograd.Function):
    """y = x W^T + b + scaling (x A^T) B^T, differentiable in x, A and B (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias, a, b, scaling):  # noqa: ANN001, ANN205
        rows = x.detach().reshape(-1, x.shape[-1])  # (n, d_in)
        low = torch.mm(rows, a.detach().T)  # (n, r)
        out = packed_product(rows, weight, bias)  # (n, d_out), a new tensor
        out.addmm_(low, b.detach().T, alpha=scaling)
        ctx.save_for_backward(rows, weight, a, b, low)
        ctx.scaling = scaling
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    @once_differentiable  # the products are not recorded: a second derivative is refused, not zero
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        rows, weight, a, b, low = ctx.saved_tensors
        want_x, _, _, want_a, want_b, _ = ctx.needs_input_grad
        g = grad.reshape(-1, grad.shape[-1])  # (n, d_out)
        grad_b = torch.mm(low.T, g).mul_(ctx.scaling).T if want_b else None  # (d_out, r), from (r, d_out)
        glow = torch.mm(g, b.T.contiguous().T).mul_(ctx.scaling)  # (n, r); B^T row-major: MKL's fast order
        grad_a = torch.mm(glow.T, rows) if want_a else None  # (r, d_in)
        grad_x = None
        if want_x:
            grad_x = packed_transposed_product(g, weight).addmm_(glow, a).view(*grad.shape[:-1], rows.shape[-1])
        return grad_x, None, None, grad_a, grad_b, None
