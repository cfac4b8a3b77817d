"""Activations rounded to int8 in blocks of 32, as the int8-activation products (W8A8, W4A8) round them.

A product whose input x is int8 too (llama.cpp's Q8 vectors, qkv's C decode step for layers with
``activations = "int8"``) cuts x into blocks c of 32 consecutive values along its last axis and rounds each
block on its own scale:

    d_c = max_j |x_cj| / 127,    xq_cj = round(x_cj / d_c)  in [-127, 127],    x_cj ~ d_c xq_cj,

so a block's error is at most d_c / 2 per value, and one large activation (small models keep a few in fixed
channels) coarsens only its own block. :func:`round_blocks` returns d_c xq_c in x's dtype: what a PyTorch path
multiplies so that its numbers are those of the integer product (up to the order of the sums). Ties go to the
even level, as the CPU's conversion does, and x is scaled by 127 / max (the C step's form) rather than divided.

**Rounding twice** (``activations = "int8x2"``): what the first rounding missed, r = x - d xq (at most d / 2 a
value), is rounded again on a step 254 times finer, the finest whose levels stay within int8:

    x ~ d_c xq_c + d'_c xq'_c,    d'_c = d_c / 254,    |xq'_c| <= 127,

which leaves at most d_c / 508 a value: about 15 bits of x, where one rounding keeps 8. As the second step divides
the first, the two roundings are one 16-bit integer a value, x ~ d'_c (254 xq_c + xq'_c) with |254 xq + xq'| <=
32385: a product multiplies its weights by both with the same integer dot products, twice as many int8 ones or
one 16-bit one (the C step's AVX2 kernels), the weights read once (:func:`round_activations`; the C step's
``Mat.slices``). On SmolLM2-135M it takes W8A8's and W4A8's agreement with the float model to that of their weights
alone (docs/generation.md).
"""

from __future__ import annotations

import torch
from torch import Tensor

from qkv.quantization import native_forward

BLOCK = 32  # values per block: llama.cpp's Q8_0 / Q8_1 and the C step's
LEVEL = 127  # the top level (symmetric int8)
FINER = 254  # the second rounding's step: the first's / FINER (int8x2)
ROUNDINGS = {"int8": 1, "int8x2": 2}  # the layers' int8 activation modes: how many times x is rounded
INT8_ACTIVATIONS = tuple(ROUNDINGS)
ACTIVATION_NOTES = {"float": "", "int8": ", int8 activations", "int8x2": ", int8 activations rounded twice"}


def round_blocks(x: Tensor) -> Tensor:
    """x (..., K), K a multiple of 32, with each block of 32 rounded to int8 levels times its scale."""
    if x.shape[-1] % BLOCK:
        raise ValueError(
            f"int8 activations are rounded in blocks of {BLOCK}: a width of {x.shape[-1]} is not a multiple"
        )
    if _native_applies(x):
        return native_forward.round_blocks(x)
    blocks, inverse, step = _blocks_and_steps(x)
    return (torch.round(blocks * inverse) * step).reshape(x.shape).to(x.dtype)


def _blocks_and_steps(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """x's blocks of 32 in float32 (..., K / 32, 32), and each block's 1 / d (0 where all zeros) and d."""
    blocks = x.float().reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    top = blocks.abs().amax(-1, keepdim=True)
    inverse = torch.full_like(top, float(LEVEL)) / top  # one division, as the C step's (127 / top is 1 / top * 127)
    return blocks, torch.where(top > 0, inverse, torch.zeros_like(top)), top / LEVEL


def round_activations(x: Tensor, activations: str) -> Tensor:
    """x as a layer whose ``activations`` is "int8" or "int8x2" multiplies it: rounded once or twice (see the module
    docstring), in x's dtype."""
    if ROUNDINGS[activations] == 2 and x.shape[-1] % BLOCK == 0 and _native_applies(x):
        return native_forward.round_blocks_twice(x)  # a prompt's rows: one pass instead of three
    if ROUNDINGS[activations] == 1:
        return round_blocks(x)
    if x.shape[-1] % BLOCK:
        round_blocks(x)  # its error names the width
    blocks, inverse, step = _blocks_and_steps(x)
    once = torch.round(blocks * inverse) * step
    missed = torch.round((blocks - once) * (inverse * FINER)) * (step / FINER)
    return (once + missed).reshape(x.shape).to(x.dtype)


NATIVE_ROWS = 64  # rows from which the C library's one pass beats PyTorch's five (a prompt's products)


def _native_applies(x: Tensor) -> bool:
    """Whether the C library rounds x: many contiguous float32 CPU rows, outside autograd and torch.compile."""
    return (
        x.dtype == torch.float32
        and x.is_contiguous()
        and x.numel() >= NATIVE_ROWS * x.shape[-1] > 0
        and not (x.requires_grad and torch.is_grad_enabled())
        and native_forward.available(x)
    )
