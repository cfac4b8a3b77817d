"""int4 and int8 layers with int8 activations multiply 16 rows at a time, one to a lane (native/int4_lanes.h and
int8_lanes.h with VNNI, lanes_avx2.h with AVX2): the same numbers at any batch size and on any number of threads,
and the layer's arithmetic in float64 on the rounded x, for whole groups of 16 rows and for the rows left over."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from qkv import native
from qkv.decoding.native_step import NativeStep, lane_kernels, native_product
from qkv.quantization import Int4Linear, Int8Linear
from tests.decoding.native_reference import Reference


@pytest.mark.parametrize("activations", ["int8", "int8x2"])
@pytest.mark.parametrize("weights", ["int4 g32", "int4 g64", "int8", "int8 g32", "int8 g64"])
@pytest.mark.parametrize("n", [16, 37, 80])
def test_rows_in_lanes_at_any_batch_and_thread_count(n: int, weights: str, activations: str) -> None:
    if native.library() is None:
        pytest.skip(f"the C kernels are unavailable ({native.unavailable_reason()})")
    torch.manual_seed(0)
    weight, bias = torch.randn(n, 192), torch.randn(n)
    weight[0, :7] = weight[:, 0].abs().max() * -3  # a row whose weights reach -127 (int8 rows are symmetric)
    group = int(weights.split("g")[1]) if " g" in weights else 0
    layer: nn.Module
    if weights.startswith("int4"):
        layer = Int4Linear.from_float(weight, bias, group_size=group)
    else:
        layer = Int8Linear.from_float(weight, bias, group_size=group)
    layer.activations = activations
    x = torch.randn(8, 192)
    x[:, 3] = 30.0  # one large activation, as small models have
    x[1, :32] = -x[1, :32].abs()  # a block of negative values only: its largest magnitude rounds to -127
    together = native_product(layer, x)
    alone = torch.cat([native_product(layer, x[b : b + 1]) for b in range(8)])
    assert torch.equal(together, alone)  # a vector's numbers never depend on its neighbours
    for threads in (1, 3):
        assert torch.equal(native_product(layer, x, threads=threads), together)
    for b in (2, 3, 5):  # every way the kernels split a batch: in twos, fours, and what is left
        assert torch.equal(native_product(layer, x[:b]), together[:b])
    reference = Reference(layer)(x.double())
    assert (together.double() - reference).abs().max() <= 1e-5 * reference.abs().max()


def test_layers_are_repacked_only_for_the_kernels_this_cpu_has() -> None:
    """Mat.lanes is packed where a kernel reads it (AVX2 or AVX-512 VNNI) and Mat.lane_off only for VNNI's, as the
    CPU's flags say (the library is built for this CPU)."""
    if native.library() is None:
        pytest.skip(f"the C kernels are unavailable ({native.unavailable_reason()})")
    try:
        flags = set(open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0].split())
    except (OSError, IndexError):
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from")
    if {"avx512vnni", "avx512bw", "avx512vl"} <= flags:
        expected = 2
    else:
        expected = 1 if {"avx2", "fma"} <= flags and "avx512f" not in flags else 0
    assert lane_kernels() == expected
    holder = NativeStep.layers_only()
    torch.manual_seed(0)
    int8 = Int8Linear.from_float(torch.randn(32, 64), None)
    int8.activations = "int8"
    int4 = Int4Linear.from_float(torch.randn(32, 64), None, group_size=32)
    int4.activations = "int8"
    mat8, mat4 = holder._mat(int8), holder._mat(int4)
    assert bool(mat8.lanes) == bool(mat4.lanes) == (expected > 0)
    assert bool(mat8.lane_off) == (expected == 2)
