"""Weight-only int8 layers: torch's own per-channel quantizer gives the same int8 matrix, and both paths of the
product (the CPU int8 kernel, the dequantizing one) give F.linear's numbers on the dequantized weights. Layers
with a scale per group of weights: torch's quantizer on each group as a row, F.linear and autograd on the
dequantized weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv.errors import QkvError
from qkv.quantization import int8_linear as int8_module
from qkv.quantization.int4_linear import bfloat16_gemm
from qkv.quantization.int8_linear import (
    Int8Linear,
    dequantize,
    int8_linear,
    kernel_applies,
    quantize_per_channel,
    quantize_per_group,
)


def reference(x: torch.Tensor, layer: Int8Linear) -> torch.Tensor:
    """F.linear in float64 with the weights the layer stands for, s[:, None] * Q."""
    bias = None if layer.bias is None else layer.bias.detach().double()
    return F.linear(x.double(), dequantize(layer.qweight, layer.weight_scale.double()), bias)


def spy_kernel(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []
    kernel = torch.ops.aten._weight_int8pack_mm

    def recording(a, q, s):
        calls.append((tuple(a.shape), a.dtype))
        return kernel(a, q, s)

    monkeypatch.setattr(int8_module.torch.ops.aten, "_weight_int8pack_mm", recording)
    return calls


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")  # deprecated, still a fine reference
def test_quantization_matches_torch_per_channel_quantizer() -> None:
    weight = torch.randn(48, 80) * torch.rand(48, 1) * 3  # rows of very different size
    q, scale = quantize_per_channel(weight)
    theirs = torch.quantize_per_channel(weight, scale.double(), torch.zeros(48, dtype=torch.long), 0, torch.qint8)
    assert q.dtype == torch.int8 and q.is_contiguous()
    assert torch.equal(q, theirs.int_repr())
    torch.testing.assert_close(dequantize(q, scale), theirs.dequantize())
    assert int(q.abs().max(dim=1).values.min()) == 127  # every row uses the full range
    assert bool(((dequantize(q, scale) - weight).abs() <= scale[:, None] / 2 + 1e-7).all())


def test_a_row_of_zeros_gets_scale_one() -> None:
    weight = torch.randn(4, 16)
    weight[2] = 0
    q, scale = quantize_per_channel(weight)
    assert scale[2] == 1 and not q[2].any()
    assert torch.isfinite(dequantize(q, scale)).all()


@pytest.mark.parametrize("leading", [(1,), (1, 1), (3, 2), (1, 16), (2, 20)])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_equals_f_linear_on_the_dequantized_weights(monkeypatch, leading, bias) -> None:
    calls = spy_kernel(monkeypatch)
    torch.manual_seed(0)
    layer = Int8Linear.from_float(torch.randn(40, 64), torch.randn(40) if bias else None)
    x = torch.randn(*leading, 64)
    with torch.no_grad():
        out = layer(x)
    assert out.shape == (*leading, 40) and out.dtype == torch.float32
    rows = x.numel() // 64
    assert bool(calls) == (rows <= int8_module.KERNEL_ROWS)  # few vectors: the int8 kernel
    # The kernel reads x rounded to bfloat16 and rounds its sums to bfloat16 (8 significant bits) before the
    # scales; so does the dequantizing path for many rows on a CPU with bfloat16 products, else it is float32.
    if calls or bfloat16_gemm():  # |error| <= half a bfloat16 unit of the sum: 2^-9 sum_j |x_j Q_ij| s_i (2^-8: slack)
        bound = F.linear(x.bfloat16().double().abs(), layer.weight.double().abs()) * 2.0**-8 + 1e-6
        assert bool(((out.double() - reference(x.bfloat16(), layer)).abs() <= bound).all())
    else:
        torch.testing.assert_close(out.double(), reference(x, layer), atol=1e-5, rtol=1e-5)


def test_kernel_path_error_is_that_of_bfloat16_inputs() -> None:
    torch.manual_seed(0)
    layer = Int8Linear.from_float(torch.randn(256, 512) * 0.02, torch.zeros(256))
    x = torch.randn(4, 512)
    assert kernel_applies(x, layer.qweight)
    with torch.no_grad():
        out = layer(x)
    exact = reference(x, layer)
    rounded = reference(x.bfloat16().float(), layer)
    assert float((out - exact).norm() / exact.norm()) < 1e-2
    assert float((out - rounded).norm() / rounded.norm()) < 5e-3  # the rest is the bfloat16 output


def test_when_the_kernel_applies() -> None:
    q = torch.zeros(32, 64, dtype=torch.int8)
    assert kernel_applies(torch.randn(1, 64), q)
    assert kernel_applies(torch.randn(2, 8, 64), q)  # 16 vectors
    assert not kernel_applies(torch.randn(1, 17, 64), q)  # 17 vectors: BLAS on the widened matrix wins
    assert not kernel_applies(torch.randn(1, 60), torch.zeros(32, 60, dtype=torch.int8))  # K % 16: unsafe loads
    assert not kernel_applies(torch.randn(1, 64, dtype=torch.float64), q)
    assert not kernel_applies(torch.randn(1, 64), q.t().contiguous().t())  # a strided matrix


def test_widths_the_kernel_cannot_read_take_the_dequantizing_path(monkeypatch) -> None:
    calls = spy_kernel(monkeypatch)
    layer = Int8Linear.from_float(torch.randn(10, 60), torch.randn(10))
    x = torch.randn(1, 60)
    torch.testing.assert_close(layer(x).double(), reference(x, layer), atol=1e-5, rtol=1e-5)
    assert not calls


def test_the_dequantizing_path_in_slices_gives_the_same_numbers(monkeypatch) -> None:
    layer = Int8Linear.from_float(torch.randn(50, 32), torch.randn(50))
    x = torch.randn(3, 20, 32)
    whole = layer(x)
    monkeypatch.setattr(int8_module, "DEQUANTIZE_SLICE", 7 * 32)  # 7 rows at a time, 8 slices
    torch.testing.assert_close(layer(x), whole)


def test_bfloat16_activations() -> None:
    layer = Int8Linear.from_float(torch.randn(32, 64), torch.randn(32)).to(torch.bfloat16)
    assert layer.qweight.dtype == torch.int8 and layer.weight_scale.dtype == torch.bfloat16
    for shape in ((1, 64), (4, 16, 64)):  # kernel, then dequantizing path
        x = torch.randn(*shape, dtype=torch.bfloat16)
        out = layer(x)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.double(), reference(x, layer), atol=0.1, rtol=2e-2)


def test_weight_is_the_dequantized_matrix_and_parameters_take_no_gradient() -> None:
    weight = torch.randn(8, 16)
    layer = Int8Linear.from_float(weight)
    torch.testing.assert_close(layer.weight, dequantize(*quantize_per_channel(weight)))
    assert sum(p.numel() for p in layer.parameters()) == 8 * 16 + 8
    assert not layer.qweight.requires_grad and not layer.weight_scale.requires_grad
    assert set(layer.state_dict()) == {"qweight", "weight_scale"}


def test_stacked_layers_give_the_parts_side_by_side() -> None:
    parts = [Int8Linear.from_float(torch.randn(n, 32), torch.randn(n)) for n in (32, 16, 16)]
    stacked = Int8Linear.cat(parts)
    for x in (torch.randn(1, 32), torch.randn(2, 12, 32)):
        torch.testing.assert_close(stacked(x), torch.cat([p(x) for p in parts], dim=-1), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="one input width"):
        Int8Linear.cat([parts[0], Int8Linear.from_float(torch.randn(4, 16))])


def test_direct_call_matches_the_layer() -> None:
    layer = Int8Linear.from_float(torch.randn(24, 48), torch.randn(24))
    x = torch.randn(2, 48)
    torch.testing.assert_close(int8_linear(x, layer.qweight, layer.weight_scale, layer.bias), layer(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_takes_the_dequantizing_path() -> None:
    layer = Int8Linear.from_float(torch.randn(64, 128), torch.randn(64)).cuda()
    x = torch.randn(1, 128, device="cuda")
    assert not kernel_applies(x, layer.qweight)
    torch.testing.assert_close(layer(x).double().cpu(), reference(x.cpu(), layer.cpu()), atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------------- scales per group of weights


def grouped_weight(n_out: int, n_in: int) -> torch.Tensor:
    """Columns of very different sizes, so that the groups of a row get very different scales."""
    return torch.randn(n_out, n_in) * torch.rand(n_in).mul(4).exp()


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
@pytest.mark.parametrize("group", [32, 64, 96])
def test_groups_are_torchs_per_channel_quantizer_on_each_group_as_a_row(group) -> None:
    weight = grouped_weight(12, 192)
    weight[3, :group] = 0  # a group of zeros: scale 1, levels 0
    q, scale = quantize_per_group(weight, group)
    assert q.dtype == torch.int8 and scale.shape == (12, 192 // group) and scale[3, 0] == 1 and not q[3, :group].any()
    rows = weight.reshape(-1, group)  # (N K / g, g): each group a row
    theirs = torch.quantize_per_channel(rows, scale.reshape(-1).double(), torch.zeros(rows.shape[0]).long(), 0,
                                        torch.qint8)  # fmt: skip
    assert torch.equal(q, theirs.int_repr().reshape(12, 192))
    torch.testing.assert_close(dequantize(q, scale), theirs.dequantize().reshape(12, 192), atol=0, rtol=0)
    per_group = scale.repeat_interleave(group, dim=1)  # (N, K): each weight's scale
    assert bool(((dequantize(q, scale) - weight).abs() <= per_group / 2 * (1 + 1e-6)).all())


@pytest.mark.parametrize("leading", [(1,), (3,), (2, 20)])
@pytest.mark.parametrize("bias", [True, False])
def test_a_grouped_layer_is_f_linear_on_its_dequantized_weights_and_never_the_row_kernel(monkeypatch, leading, bias):
    calls = spy_kernel(monkeypatch)
    torch.manual_seed(0)
    layer = Int8Linear.from_float(grouped_weight(40, 128), torch.randn(40) if bias else None, group_size=32)
    assert layer.group_size == 32 and layer.weight_scale.shape == (40, 4)
    x = torch.randn(*leading, 128)
    with torch.no_grad():
        out = layer(x)
    assert out.shape == (*leading, 40) and calls == []
    theirs = reference(x, layer)
    if x.numel() > int8_module.KERNEL_ROWS * 128 and bfloat16_gemm():  # a prompt: x and s Q in bfloat16
        spread = F.linear(x.double().abs(), layer.weight.double().abs())
        assert bool(((out.double() - theirs).abs() <= 2 * 2**-8 * spread + 1e-5).all())
    else:
        assert (out.double() - theirs).abs().max() <= 1e-5 * theirs.abs().max()


def test_a_grouped_layer_in_slices_and_in_bfloat16(monkeypatch) -> None:
    layer = Int8Linear.from_float(grouped_weight(40, 64), torch.randn(40), group_size=32)
    x = torch.randn(3, 64)
    whole = layer(x).detach()
    monkeypatch.setattr(int8_module, "DEQUANTIZE_SLICE", 64 * 7)  # 7 rows at a time: 6 slices
    torch.testing.assert_close(layer(x), whole, atol=1e-5 * float(whole.abs().max()), rtol=0)  # BLAS's sum order
    torch.testing.assert_close(layer.to(torch.bfloat16)(x.bfloat16()).float(), whole, atol=0.5, rtol=2e-2)


@pytest.mark.parametrize("bias", [True, False])
def test_the_backward_of_a_grouped_layer_is_autograds_through_the_dequantized_matrix(monkeypatch, bias) -> None:
    monkeypatch.setattr(int8_module, "DEQUANTIZE_SLICE", 64 * 5)  # several slices of rows
    layer = Int8Linear.from_float(grouped_weight(24, 64), torch.randn(24) if bias else None, group_size=32)
    x = torch.randn(2, 5, 64, requires_grad=True)
    grad = torch.randn(2, 5, 24)
    layer(x).backward(grad)
    x64 = x.detach().double().requires_grad_()
    bias64 = None if layer.bias is None else layer.bias.detach().double().requires_grad_()
    F.linear(x64, layer.weight.double(), bias64).backward(grad.double())
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-4, rtol=1e-5)
    if bias:
        torch.testing.assert_close(layer.bias.grad.double(), bias64.grad, atol=1e-5, rtol=1e-6)
    assert layer.qweight.grad is None and layer.weight_scale.grad is None


def test_stacked_grouped_layers_give_the_parts_and_refuse_other_group_sizes() -> None:
    parts = [Int8Linear.from_float(grouped_weight(n, 64), torch.randn(n), group_size=32) for n in (32, 16, 8)]
    stacked = Int8Linear.cat(parts)
    assert stacked.group_size == 32 and stacked.weight_scale.shape == (56, 2)
    for x in (torch.randn(1, 64), torch.randn(2, 12, 64)):
        theirs = torch.cat([p(x) for p in parts], dim=-1).detach()
        torch.testing.assert_close(stacked(x), theirs, atol=1e-5 * float(theirs.abs().max()), rtol=0)
    for other in (Int8Linear.from_float(torch.randn(8, 64), torch.randn(8)), Int8Linear.from_float(
            torch.randn(8, 64), torch.randn(8), group_size=64)):  # fmt: skip
        with pytest.raises(ValueError, match="one group size"):
            Int8Linear.cat([parts[0], other])


def test_group_size_zero_is_a_scale_per_row_and_bad_sizes_are_refused() -> None:
    weight = torch.randn(8, 64)
    per_row = Int8Linear.from_float(weight, group_size=0)
    q, scale = quantize_per_channel(weight)
    assert per_row.group_size == 0 and torch.equal(per_row.qweight, q) and torch.equal(per_row.weight_scale, scale)
    assert "groups" not in repr(per_row) and "groups of 32" in repr(Int8Linear(64, 8, group_size=32))
    for bad in (48, 16, -32):
        with pytest.raises(QkvError, match="multiple of 32"):
            Int8Linear(64, 8, group_size=bad)
    with pytest.raises(QkvError, match="96 inputs, not a multiple of the int8 group size 64: use --group-size 32"):
        Int8Linear(96, 8, group_size=64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_grouped_layers() -> None:
    layer = Int8Linear.from_float(grouped_weight(64, 128), torch.randn(64), group_size=32).cuda()
    x = torch.randn(3, 128, device="cuda")
    torch.testing.assert_close(layer(x).double().cpu(), reference(x.cpu(), layer.cpu()), atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [32, 96])
def test_the_c_library_widens_groups_to_pytorchs_numbers(monkeypatch, dtype, group) -> None:
    """The C pass (a prompt's grouped products, dL/dx under LoRA) gives PyTorch's s Q bit for bit: rounded to float32,
    then bfloat16 to nearest even."""
    from qkv import native

    if native.library() is None:
        pytest.skip(f"the C kernels are unavailable: {native.unavailable_reason()}")
    q = torch.randint(-127, 128, (37, 192), dtype=torch.int8)
    scale = torch.rand(37, 192 // group) * 0.1
    scale[0, 0] = 3e5  # large values round in bfloat16 as well
    assert int8_module._native_applies(q, scale, dtype)
    ours = dequantize(q, scale, dtype)
    monkeypatch.setattr(int8_module, "_native_applies", lambda *args: False)
    theirs = dequantize(q, scale, dtype)
    assert ours.dtype == dtype and torch.equal(ours, theirs)
