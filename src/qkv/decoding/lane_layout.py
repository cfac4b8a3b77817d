"""Quantized layers repacked 16 rows to a vector: the layout of the C step's 16-row kernels (``Mat.lanes``).

A 64-byte vector of ``native/int8_lanes.h`` holds 4 consecutive weights of each of 16 rows, one row to a 32-bit
lane, so that one VNNI dot product (``vpdpbusd``) multiplies 16 rows by 4 values of x at once; AVX2's kernels
(``native/lanes_avx2.h``) read the same vector as two halves of 8 rows. For rows r of group g and block c of 32
columns,

    int8:  vector v of block c = [W[16 g + r, 32 c + 4 v + t] for r in 0..15 for t in 0..3]     (v = 0..7)
    int4:  the same with levels (two to a byte), x's columns in Input.swapped's order (a block's 16 even columns,
           then its 16 odd ones): the low nibbles of vector v hold positions 8 v + t, the high ones 8 v + 4 + t.

The rows past the last whole 16 stay in the row-major matrix (the one-row kernels take them). The int4 layout is
made by the layer itself (:meth:`~qkv.quantization.int4_linear.Int4Linear.lanes`, one copy kept on it for the step
and a prompt's product); the int8 one here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from qkv.quantization.activation_blocks import BLOCK
from qkv.quantization.int4_linear import LANE_ROWS, per_lane
from qkv.quantization.int8_linear import Int8Linear


def int8_lanes(module: Int8Linear, offsets: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """An int8 layer's weights in the 16-row layout (g, c, v, r, t), its scales per group (g, groups, 16; None
    with one per row) and, with ``offsets`` (VNNI's kernel, which multiplies xq + 128), -128 times each block's
    sum of weights (g, c, 16)."""
    n, k = module.qweight.shape
    g, rows, blocks = n // LANE_ROWS, n // LANE_ROWS * LANE_ROWS, k // BLOCK
    q = module.qweight[:rows].reshape(g, LANE_ROWS, blocks, 8, 4)  # columns 32 c + 4 v + t
    packed = q.permute(0, 2, 3, 1, 4)  # (g, c, v, r, t): vector v of block c holds 4 weights of each row
    scales = None
    if module.group_size:
        scales = per_lane(module.weight_scale, g)
    sums = q.sum(dim=(3, 4), dtype=torch.int32).mul_(-128).transpose(1, 2) if offsets else None  # (g, c, r)
    return packed, scales, sums
