"""Weight-only int8 layers: torch's own per-channel quantizer gives the same int8 matrix, and both paths of the
product (the CPU int8 kernel, the dequantizing one) give F.linear's numbers on the dequantized weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv.quantization import int8_linear as int8_module
from qkv.quantization.int4_linear import bfloat16_gemm
from qkv.quantization.int8_linear import Int8Linear, dequantize, int8_linear, kernel_applies, quantize_per_channel


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
