"""int4 layers with int8 activations multiply 16 rows at a time, one to a lane (native/int4_lanes.h): the same
numbers as float64 arithmetic on the rounded x, at any batch size and on any number of threads, for whole groups
of 16 rows and for the rows left over."""

from __future__ import annotations

import pytest
import torch

from qkv import native
from qkv.decoding.native_step import native_product
from qkv.quantization import Int4Linear
from qkv.quantization.activation_blocks import round_blocks


@pytest.mark.parametrize("group", [32, 64])
@pytest.mark.parametrize("n", [16, 37, 80])
def test_rows_in_lanes_at_any_batch_and_thread_count(n: int, group: int) -> None:
    if native.library() is None:
        pytest.skip(f"the C kernels are unavailable ({native.unavailable_reason()})")
    torch.manual_seed(0)
    layer = Int4Linear.from_float(torch.randn(n, 192), torch.randn(n), group_size=group)
    layer.activations = "int8"
    x = torch.randn(8, 192)
    x[:, 3] = 30.0  # one large activation, as small models have
    together = native_product(layer, x)
    alone = torch.cat([native_product(layer, x[b : b + 1]) for b in range(8)])
    assert torch.equal(together, alone)  # a vector's numbers never depend on its neighbours
    for threads in (1, 3):
        assert torch.equal(native_product(layer, x, threads=threads), together)
    reference = torch.nn.functional.linear(round_blocks(x).double(), layer.weight.double(), layer.bias.double())
    assert (together.double() - reference).abs().max() <= 1e-5 * reference.abs().max()
