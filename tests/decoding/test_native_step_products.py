"""The native step's products alone (native_product) against their arithmetic in float64: each kind of weight
and activation, a grouped int8 layer's PyTorch forward against its C product, every row shared out once among the
threads, and float x times int8 rows in float32 or bfloat16 as the CPU is told (tests/decoding/test_native_step.py
has the whole step)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from qkv import native
from qkv.decoding.native_step import int8_in_bfloat16, native_product
from qkv.quantization import Int4Linear, Int8Linear
from qkv.quantization.activation_blocks import round_activations
from qkv.quantization.int4_linear import bfloat16_gemm
from qkv.quantization.int8_linear import KERNEL_ROWS
from tests.decoding.native_reference import Reference, _library, activations_of  # noqa: F401 (the autouse fixture)

INT8_GROUPS = ["int8 g32", "int8 g64", "int8 g96", "int8 activations g32", "int8 activations g64"]
GROUPED_WIDTH = {32: 416, 64: 384, 96: 288}  # 13 blocks of 32 (the last pair half empty), 12, and 9 in groups of 3


@pytest.mark.parametrize("rows", [1, 3, 8, 11])
@pytest.mark.parametrize(
    "kind",
    ["float32", "int8", "int8 activations", *INT8_GROUPS, "int4 g32", "int4 g128", "int4 g32 activations",
     "int4 g128 activations", "int8 twice", "int8 twice g32", "int4 g32 twice"],
)  # fmt: skip
def test_each_product_computes_the_layers_numbers(kind: str, rows: int) -> None:
    """One product of each kind, against its arithmetic in float64 (rows beyond 8 take a second pass); the
    widths leave a block of 32 and a row of 16 over, and x has one large value, as small models' do. Int8 with
    scales per group: columns of different sizes, so that each group's scale differs."""
    torch.manual_seed(0)
    group = int(kind.split("g")[-1]) if kind.startswith("int8") and " g" in kind else 0
    width = GROUPED_WIDTH[group] if group else 384
    weight, bias = torch.randn(40, width), torch.randn(40)
    if group:
        weight = weight * torch.rand(width).mul(4).exp()  # scales from 1 to e^4 across the groups
    x = torch.randn(rows, width)
    x[:, 5] = 40.0
    if kind == "float32":
        layer: nn.Module = nn.Linear(384, 40)
        layer.weight.data, layer.bias.data = weight, bias
        theirs = x.double() @ weight.double().T + bias.double()
    elif kind.startswith("int8"):
        layer = Int8Linear.from_float(weight, bias, group_size=group)
        layer.activations = activations_of(kind)
        theirs = Reference(layer)(x.double())
    else:
        layer = Int4Linear.from_float(weight, bias, group_size=int(kind.split()[1][1:]))
        layer.activations = activations_of(kind)
        theirs = Reference(layer)(x.double())
    ours = native_product(layer, x)
    assert (ours.double() - theirs).abs().max().item() <= 1e-5 * theirs.abs().max().item()


@pytest.mark.parametrize("rows", [12, 20])
@pytest.mark.parametrize("activations", ["float", "int8", "int8x2"])
def test_a_grouped_int8_layers_pytorch_forward_agrees_with_the_c_product(activations: str, rows: int) -> None:
    """A prompt (the layer's PyTorch forward) and the decode steps (the C product) round x alike and give the same
    numbers up to float32 summation order; past KERNEL_ROWS rows, where the prompt multiplies in bfloat16 on a CPU
    with bfloat16 products (as per-row int8 and int4 layers do), and where the C product multiplies float x in
    bfloat16, up to bfloat16's rounding of x and s Q."""
    torch.manual_seed(0)
    layer = Int8Linear.from_float(torch.randn(40, 416) * torch.rand(416).mul(3).exp(), torch.randn(40), group_size=32)
    layer.activations = activations
    x = torch.randn(rows, 416)
    x[:, 7] = 40.0
    with torch.no_grad():
        prompt = layer(x)
    steps = torch.cat([native_product(layer, x[i : i + 4]) for i in range(0, rows, 4)])
    if (rows > KERNEL_ROWS and bfloat16_gemm()) or (activations == "float" and int8_in_bfloat16(416)):
        inputs = x if activations == "float" else round_activations(x, activations)
        spread = torch.nn.functional.linear(inputs.abs(), layer.weight.abs())
        assert bool(((steps - prompt).abs() <= 2 * 2**-8 * spread + 1e-4).all())
    else:
        assert (steps - prompt).abs().max() <= 1e-5 * prompt.abs().max()


@pytest.mark.parametrize("n", [1, 5, 16, 37, 4160])
def test_the_threads_share_out_every_row_once(n: int) -> None:
    """Matrices of a row, of fewer rows than threads, of a step of 16 rows, of a step and then some, and a large
    one shared 64 rows at a time, on 1 to 9 threads (more threads than this machine has cores, so that some
    wait and the others take their rows): every row is written (none left NaN) with the numbers of one thread."""
    torch.manual_seed(0)
    layer = nn.Linear(64, n)
    x = torch.randn(3, 64)
    one = native_product(layer, x, threads=1)
    assert torch.allclose(one, layer(x), atol=1e-5)
    for threads in (2, 3, 9):
        assert torch.equal(native_product(layer, x, threads=threads), one)


@pytest.mark.parametrize("group", [0, 32])
@pytest.mark.parametrize("choice", [0, 1])
def test_float_x_int8_rows_in_float32_or_bfloat16_as_the_cpu_is_told(choice: int, group: int) -> None:
    """Weight-only int8 rows multiply x in bfloat16 where the CPU's bfloat16 dot products pay (AMD) and in float32
    where they do not (Intel): either path, forced, gives W x with x as int8_in_bfloat16 says (float32 sums)."""
    lib = native.library()
    if lib is None:
        pytest.skip(f"the C kernels are unavailable ({native.unavailable_reason()})")
    torch.manual_seed(0)
    layer = Int8Linear.from_float(torch.randn(24, 96), torch.randn(24), group_size=group)
    x = torch.randn(3, 96)
    lib.qkv_set_int8_bf16(choice)
    try:
        in_bfloat16 = int8_in_bfloat16(96)
        y = native_product(layer, x)
    finally:
        lib.qkv_set_int8_bf16(-1)
    if choice == 1 and not in_bfloat16:
        pytest.skip("this CPU has no AVX512_BF16: its int8 rows always multiply x in float32")
    assert in_bfloat16 == (choice == 1)
    weight = layer.weight.double()
    if in_bfloat16:  # with groups, s Q is rounded to bfloat16 too
        x = x.bfloat16()
        weight = weight.bfloat16() if group else weight
    reference = torch.nn.functional.linear(x.double(), weight.double(), layer.bias.double())
    assert (y.double() - reference).abs().max() <= 1e-5 * reference.abs().max()
