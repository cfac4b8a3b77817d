"""The 16-row layout of the C step's lane kernels, checked element by element against its definition."""

from __future__ import annotations

import torch

from qkv.decoding.lane_layout import int8_lanes
from qkv.quantization.int4_linear import Int4Linear, unpack_nibbles
from qkv.quantization.int8_linear import Int8Linear


def test_int8_vectors_hold_four_weights_of_each_of_16_rows_and_the_rest_stay_behind() -> None:
    torch.manual_seed(0)
    layer = Int8Linear.from_float(torch.randn(37, 64), None, group_size=32)  # 2 groups of 16 rows, 5 rows left
    packed, scales, offsets = int8_lanes(layer, offsets=True)
    assert packed.shape == (2, 2, 8, 16, 4) and scales is not None and offsets is not None
    q = layer.qweight
    for g, c, v, r, t in [(0, 0, 0, 0, 0), (1, 1, 7, 15, 3), (0, 1, 3, 9, 2), (1, 0, 5, 4, 1)]:
        assert packed[g, c, v, r, t] == q[16 * g + r, 32 * c + 4 * v + t]
        assert scales[g, c, r] == layer.weight_scale[16 * g + r, c]
        assert offsets[g, c, r] == -128 * int(q[16 * g + r, 32 * c : 32 * c + 32].int().sum())
    no_offsets = int8_lanes(Int8Linear.from_float(torch.randn(16, 32), None), offsets=False)
    assert no_offsets[1] is None and no_offsets[2] is None  # scales per row stay in the Mat; no VNNI sums


def test_int4_levels_follow_x_in_its_even_then_odd_order() -> None:
    torch.manual_seed(1)
    layer = Int4Linear.from_float(torch.randn(32, 64), None, group_size=32)
    packed, scales, minimums = layer.lanes()
    levels = unpack_nibbles(layer.qweight)  # (32, 64), columns in order
    assert packed.shape == (2, 2, 4, 16, 4)
    for g, c, v, r, t in [(0, 0, 0, 0, 0), (1, 1, 3, 15, 3), (0, 1, 2, 7, 1)]:
        low, high = 8 * v + t, 8 * v + 4 + t  # positions in the block's order: 16 even columns, then 16 odd
        column = [2 * p if p < 16 else 2 * (p - 16) + 1 for p in (low, high)]
        byte = int(packed[g, c, v, r, t])
        assert byte & 15 == levels[16 * g + r, 32 * c + column[0]]
        assert byte >> 4 == levels[16 * g + r, 32 * c + column[1]]
        assert scales[g, c, r] == layer.weight_scale[16 * g + r, c]
        assert minimums[g, c, r] == layer.weight_min[16 * g + r, c]
