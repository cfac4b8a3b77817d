"""Weight-only int4 layers: groups agree with the gguf package's Q4_1 quantizer, the CPU kernel computes
(q - 8) s + z with bfloat16 operands, and every path of the layer gives F.linear's numbers on the dequantized
weights within the rounding of bfloat16."""

from __future__ import annotations

import gguf
import pytest
import torch
import torch.nn.functional as F

from qkv.errors import QkvError
from qkv.layers.fused import fuse_linears
from qkv.quantization import int4_linear as int4_module
from qkv.quantization.int4_linear import (
    Int4Linear,
    dequantize,
    pack_for_kernel,
    pack_nibbles,
    quantize_groups,
    unpack_nibbles,
)

BF16_UNIT = 2.0**-8  # bfloat16 keeps 8 significant bits: rounding moves a number by at most 2^-8 of it


def spy_kernel(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []
    kernel = torch.ops.aten._weight_int4pack_mm_for_cpu

    def recording(a, b, group_size, sz):
        calls.append((tuple(a.shape), a.dtype))
        return kernel(a, b, group_size, sz)

    monkeypatch.setattr(int4_module.torch.ops.aten, "_weight_int4pack_mm_for_cpu", recording)
    return calls


def reference(x: torch.Tensor, layer: Int4Linear) -> torch.Tensor:
    """F.linear in float64 on the weights the layer stands for, s Q + m."""
    bias = None if layer.bias is None else layer.bias.detach().double()
    weight = dequantize(layer.qweight, layer.weight_scale, layer.weight_min, torch.float64)
    return F.linear(x.double(), weight, bias)


def kernel_grid(layer: Int4Linear) -> torch.Tensor:
    """The matrix the kernel multiplies by: (q - 8) s + z with s and z = m + 8 s rounded to bfloat16 (float64)."""
    n_out, n_in = layer.out_features, layer.in_features
    s = layer.weight_scale.double()
    z = (layer.weight_min.float() + 8 * layer.weight_scale.float()).bfloat16().double()
    q = unpack_nibbles(layer.qweight).double().view(n_out, -1, layer.group_size)
    return ((q - 8) * s.bfloat16().double()[..., None] + z[..., None]).view(n_out, n_in)


def test_nibbles_round_trip_low_first() -> None:
    levels = torch.randint(0, 16, (5, 64), dtype=torch.uint8)
    packed = pack_nibbles(levels)
    assert packed.shape == (5, 32) and packed.dtype == torch.uint8
    assert int(packed[0, 0]) == int(levels[0, 0]) | int(levels[0, 1]) << 4
    assert torch.equal(unpack_nibbles(packed), levels)


def test_groups_match_gguf_q4_1_quantizer() -> None:
    """gguf's numpy Q4_1 (llama.cpp's) is the same min/max grid: the same minimums, scales within a float16
    rounding (theirs is (max - min) / 15 from the unrounded minimum), the same levels but for ties."""
    from qkv.quantization.gguf_blocks import q4_groups

    torch.manual_seed(0)
    weight = torch.randn(64, 256) * torch.rand(64, 1)
    qweight, scale, minimum = quantize_groups(weight, 32)
    blocks = gguf.quants.quantize(weight.numpy(), gguf.GGMLQuantizationType.Q4_1)
    their_q, their_scale, their_min = q4_groups(blocks, "Q4_1", (64, 256))
    assert torch.equal(minimum, their_min)
    assert bool(((scale.float() - their_scale.float()).abs() <= scale.float() * 2.0**-10).all())
    differ = unpack_nibbles(qweight).int() - their_q.int()
    assert int(differ.abs().max()) <= 1 and float((differ != 0).float().mean()) < 0.01
    ours = dequantize(qweight, scale, minimum)
    assert bool(((ours - weight).abs() <= scale.float().repeat_interleave(32, dim=1) / 2 + 1e-6).all())  # nearest


def test_larger_groups_are_coarser() -> None:
    """Gaussian weights: a group of g spans about 2 sqrt(2 ln g) sigma in 15 steps; the error is step / sqrt 12."""
    torch.manual_seed(0)
    weight = torch.randn(64, 512)
    errors = []
    for group_size in (32, 64, 128, 256):
        layer = Int4Linear.from_float(weight, None, group_size)
        assert layer.weight_scale.shape == (64, 512 // group_size) and layer.qweight.shape == (64, 256)
        errors.append(float((layer.weight - weight).norm() / weight.norm()))
    assert 0.065 < errors[0] < 0.085 and errors == sorted(errors) and errors[-1] < 0.12


def test_the_kernel_computes_q_minus_8_times_s_plus_z_in_bfloat16() -> None:
    """The kernel's semantics: W = (q - 8) s + z, s and z bfloat16 (K / g, N, 2), sums rounded to bfloat16."""
    torch.manual_seed(0)
    layer = Int4Linear.from_float(torch.randn(80, 128) * 0.05, None, 64)
    packed, sz = pack_for_kernel(layer.qweight, layer.weight_scale, layer.weight_min)
    assert packed.dtype == torch.uint8 and sz.shape == (2, 80, 2) and sz.dtype == torch.bfloat16
    x = torch.randn(5, 128).bfloat16()
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 64, sz).double()
    exact = x.double() @ kernel_grid(layer).T
    assert bool(((out - exact).abs() <= BF16_UNIT * exact.abs() + 1e-6).all())  # output rounding only


@pytest.mark.parametrize("rows", [1, 3, 8, 17, 64])
@pytest.mark.parametrize("shape", [(48, 64), (40, 96)])  # 40: rows padded to 48 for the kernel
@pytest.mark.parametrize("bias", [True, False])
def test_kernel_path_equals_the_reference_within_bfloat16(monkeypatch, rows, shape, bias) -> None:
    calls = spy_kernel(monkeypatch)
    torch.manual_seed(rows)
    n_out, n_in = shape
    layer = Int4Linear.from_float(torch.randn(n_out, n_in) * 0.05, torch.randn(n_out) if bias else None)
    x = torch.randn(rows, n_in)
    with torch.no_grad():
        out = layer(x)
    assert calls == [((rows, n_in), torch.bfloat16)] and out.shape == (rows, n_out) and out.dtype == torch.float32
    # Rounding of x, of s and z (2^-8 each, relative) and of the sum: bounded by |x| (|q - 8| |s| + |z| + |w|).
    grid = kernel_grid(layer)
    spread = F.linear(x.double().abs(), (grid - reference_bias_free(layer)).abs() + grid.abs())
    bound = BF16_UNIT * (spread + reference(x, layer).abs()) + 1e-6
    assert bool(((out.double() - reference(x, layer)).abs() <= bound).all())


def reference_bias_free(layer: Int4Linear) -> torch.Tensor:
    return dequantize(layer.qweight, layer.weight_scale, layer.weight_min, torch.float64)


def test_many_rows_use_a_bfloat16_product_of_the_dequantized_matrix(monkeypatch) -> None:
    calls = spy_kernel(monkeypatch)
    torch.manual_seed(0)
    layer = Int4Linear.from_float(torch.randn(48, 64) * 0.05, torch.randn(48))
    x = torch.randn(2, 100, 64)  # 200 rows > KERNEL_ROWS
    with torch.no_grad():
        out = layer(x)
    assert not calls and out.shape == (2, 100, 48) and out.dtype == torch.float32
    exact = reference(x, layer)
    spread = F.linear(x.double().abs(), reference_bias_free(layer).abs())
    assert bool(((out.double() - exact).abs() <= 2 * BF16_UNIT * spread + 1e-6).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_dtypes(dtype) -> None:
    torch.manual_seed(0)
    layer = Int4Linear.from_float(torch.randn(32, 64) * 0.05, torch.randn(32))
    x = torch.randn(3, 64, dtype=dtype)
    with torch.no_grad():
        out = layer(x)
    assert out.dtype == dtype
    tolerance = 1e-12 if dtype == torch.float64 else 3 * BF16_UNIT  # float64: the plain path, exactly
    torch.testing.assert_close(out.double(), reference(x, layer), rtol=tolerance, atol=tolerance)


def test_empty_input_and_leading_axes() -> None:
    layer = Int4Linear.from_float(torch.randn(16, 32), None)
    with torch.no_grad():
        assert layer(torch.randn(0, 32)).shape == (0, 16)
        assert layer(torch.randn(2, 0, 32)).shape == (2, 0, 16)
        assert layer(torch.randn(2, 3, 32)).shape == (2, 3, 16)


def test_packing_in_chunks_equals_packing_at_once(monkeypatch) -> None:
    torch.manual_seed(0)
    layer = Int4Linear.from_float(torch.randn(200, 64), None)  # 200 rows: 13 blocks of 16, padded to 208
    whole = pack_for_kernel(layer.qweight, layer.weight_scale, layer.weight_min)
    monkeypatch.setattr(int4_module, "PACK_ROWS", 64)
    chunked = pack_for_kernel(layer.qweight, layer.weight_scale, layer.weight_min)
    assert torch.equal(whole[0], chunked[0]) and torch.equal(whole[1], chunked[1])


def test_the_packed_copy_follows_the_weights() -> None:
    torch.manual_seed(0)
    layer, other = Int4Linear.from_float(torch.randn(32, 64), None), Int4Linear.from_float(torch.randn(32, 64), None)
    x = torch.randn(1, 64)
    with torch.no_grad():
        before = layer(x)
        layer.load_state_dict(other.state_dict())  # copies in place: the packed copy must be remade
        torch.testing.assert_close(layer(x), other(x))
    assert not torch.equal(before, layer(x))


def test_state_dict_loads_into_an_empty_layer() -> None:
    torch.manual_seed(0)
    layer = Int4Linear.from_float(torch.randn(24, 128), torch.randn(24), group_size=64)
    state = layer.state_dict()
    assert {k: v.dtype for k, v in state.items()} == {
        "qweight": torch.uint8,
        "weight_scale": torch.float16,
        "weight_min": torch.float16,
        "bias": torch.float32,
    }
    empty = Int4Linear(128, 24, bias=True, group_size=64)
    empty.load_state_dict(state)
    x = torch.randn(4, 128)
    with torch.no_grad():
        assert torch.equal(empty(x), layer(x))


def test_stacked_layers_give_the_same_numbers() -> None:
    torch.manual_seed(0)
    parts = [Int4Linear.from_float(torch.randn(n, 64), torch.randn(n)) for n in (64, 32, 32)]
    fused = fuse_linears(*parts)
    assert isinstance(fused, Int4Linear) and fused.out_features == 128
    x = torch.randn(2, 64)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), torch.cat([p(x) for p in parts], dim=-1), rtol=0, atol=0)
    mixed = fuse_linears(parts[0], Int4Linear.from_float(torch.randn(8, 64), None))  # bias and no bias
    assert not isinstance(mixed, Int4Linear)


def test_flat_and_zero_groups_are_exact() -> None:
    weight = torch.zeros(16, 64)
    weight[1, :32] = 0.25  # a flat group: scale 0, the value in the minimum
    layer = Int4Linear.from_float(weight, None)
    assert torch.equal(layer.weight, weight)


def test_bad_input_is_one_line() -> None:
    with pytest.raises(QkvError, match=r"group size 16: int4 groups hold 32, 64, 128, 256 weights"):
        Int4Linear(64, 8, group_size=16)
    with pytest.raises(QkvError, match=r"has 96 inputs, not a multiple of the group size 64: use --group-size 32"):
        quantize_groups(torch.randn(8, 96), 64)
    with pytest.raises(QkvError, match=r"has 40 inputs, not a multiple of the group size 32: quantize to int8"):
        Int4Linear.from_float(torch.randn(8, 40))
    with pytest.raises(QkvError, match="beyond \\+-65504 do not fit int4's float16 scales"):
        Int4Linear.from_float(torch.full((8, 32), 1e5))
    with pytest.raises(QkvError, match="NaN or infinite"):
        Int4Linear.from_float(torch.full((8, 32), float("nan")))


def test_int8_activations_multiply_x_rounded_in_blocks_of_32(monkeypatch) -> None:
    """W4A8: the layer rounds x to int8 in blocks of 32 before its product (the C step's arithmetic), and the
    rounding changes the numbers, so it is not skipped."""
    from qkv.quantization.activation_blocks import round_blocks

    torch.manual_seed(2)
    layer = Int4Linear.from_float(torch.randn(48, 64) * 0.05, torch.randn(48))
    x = torch.randn(3, 64) * torch.rand(64) * 4
    with torch.no_grad():
        weight_only = layer(x)
        layer.activations = "int8"
        rounded = layer(x)
        layer.activations = "float"
        assert torch.equal(rounded, layer(round_blocks(x)))
    grid = kernel_grid(layer)
    bound = BF16_UNIT * F.linear(round_blocks(x).double().abs(), grid.abs() + reference_bias_free(layer).abs()) + 1e-5
    assert bool(((rounded.double() - reference(round_blocks(x), layer)).abs() <= 2 * bound).all())
    assert (rounded - weight_only).abs().max() > 1e-3
    layer.activations = "int8"
    stacked = Int4Linear.cat([layer, layer])
    assert stacked.activations == "int8" and "int8 activations" in repr(stacked)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [16, 32, 48, 128])
def test_the_c_library_widens_to_pytorchs_numbers(monkeypatch, dtype, group) -> None:
    """The C pass (a prompt's products widen every matrix) gives PyTorch's s Q + m bit for bit: s Q rounded to
    float32, then + m, then bfloat16 to nearest even; groups of 16 and 48 take its one-by-one tail."""
    from qkv import native

    if native.library() is None:
        pytest.skip(f"the C kernels are unavailable: {native.unavailable_reason()}")
    q = torch.randint(0, 256, (37, 192 // 2), dtype=torch.uint8)
    scale = (torch.rand(37, 192 // group) * 0.1).half()
    minimum = (torch.randn(37, 192 // group) * 0.1).half()
    minimum[0, 0] = 60000.0  # large values round in bfloat16 as well
    assert int4_module._native_applies(q, scale, minimum, dtype)
    ours, rows = dequantize(q, scale, minimum, dtype), dequantize(q, scale, minimum, dtype, slice(3, 9))
    monkeypatch.setattr(int4_module, "_native_applies", lambda *args: False)
    theirs = dequantize(q, scale, minimum, dtype)
    assert ours.dtype == dtype and torch.equal(ours, theirs) and torch.equal(rows, theirs[3:9])
