"""Int8 activations (W8A8): fbgemm's product equals the formula step by step, each row is independent of its
batch, the error stays within the activations' rounding; and int8 layers fuse into one stacked layer. Layers with
scales per group multiply x rounded in blocks of 32 (as the C step rounds it) by their dequantized weights."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from qkv.decoding import generate
from qkv.decoding.fast_step import fast_step_for
from qkv.layers.fused import ConcatenatedProjections, fuse_linears
from qkv.models import GPT, GPTConfig
from qkv.quantization import dynamic, quantize_model, set_activations
from qkv.quantization.activation_blocks import round_blocks
from qkv.quantization.int4_linear import bfloat16_gemm
from qkv.quantization.int8_linear import KERNEL_ROWS, Int8Linear, dequantize

needs_fbgemm = pytest.mark.skipif(not dynamic.available(), reason="needs torch's fbgemm (x86 CPU)")
needs_vnni = pytest.mark.skipif(not dynamic.has_vnni(), reason="8-bit inputs need VNNI (else 7 bits)")


def int8_layer(n_out: int = 96, n_in: int = 128, bias: bool = True, seed: int = 0) -> Int8Linear:
    torch.manual_seed(seed)
    weight = torch.randn(n_out, n_in) * 0.05 * torch.rand(n_out, 1)
    return Int8Linear.from_float(weight, torch.randn(n_out) if bias else None)


@needs_fbgemm
@needs_vnni
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("leading", [(1,), (8,), (2, 33)])
def test_product_is_the_formula_step_by_step(bias, leading) -> None:
    layer = int8_layer(bias=bias)
    layer.activations = "int8"
    x = torch.randn(*leading, 128) * torch.rand(*leading, 1) * 4
    with torch.no_grad():
        out = layer(x)
    expected = dynamic.reference(x, layer.qweight, layer.weight_scale, layer.bias)
    assert out.shape == (*leading, 96) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)  # exact int32 sums, float32 scaling


@needs_fbgemm
def test_error_is_within_the_activations_rounding() -> None:
    layer = int8_layer()
    x = torch.randn(8, 128) * 3
    layer.activations = "int8"
    with torch.no_grad():
        both = layer(x).double()
    exact = F.linear(x.double(), dequantize(layer.qweight, layer.weight_scale.double()), layer.bias.double())
    # |sum_j (x_rj - x~_rj) W_ij| <= max_j |x_rj - x~_rj| sum_j |W_ij| <= (a_r t / 2) sum_j |W_ij|
    step = 2.0 / (255 if dynamic.has_vnni() else 127)
    bound = x.abs().amax(-1, keepdim=True).double() * step / 2 * layer.weight.double().abs().sum(1) + 1e-5
    assert bool(((both - exact).abs() <= bound).all())


@needs_fbgemm
def test_a_row_gives_the_same_numbers_alone_and_in_any_batch() -> None:
    layer = int8_layer()
    layer.activations = "int8"
    x = torch.randn(8, 128)
    x[5] *= 100  # a loud neighbour must not change the others' quantization
    with torch.no_grad():
        together = layer(x)
        for i in (0, 3, 7):
            assert torch.equal(layer(x[i : i + 1])[0], together[i])


@needs_fbgemm
def test_rows_of_zeros_give_the_bias() -> None:
    layer = int8_layer()
    layer.activations = "int8"
    with torch.no_grad():
        out = layer(torch.zeros(3, 128))
    torch.testing.assert_close(out, layer.bias.detach().expand(3, 96), atol=1e-6, rtol=0)


@needs_fbgemm
def test_the_packed_copy_follows_changes_of_the_weights() -> None:
    layer = int8_layer()
    layer.activations = "int8"
    x = torch.randn(2, 128)
    with torch.no_grad():
        before = layer(x)
        layer.qweight.neg_()  # in place: the packed copy must be made again
        after = layer(x)
    torch.testing.assert_close(after - layer.bias, -(before - layer.bias), atol=1e-5, rtol=1e-5)
    copied = copy.deepcopy(layer)
    with torch.no_grad():
        torch.testing.assert_close(copied(x), after)


@pytest.mark.parametrize("activations", ["float", "int8"])
def test_int8_projections_fuse_into_one_stacked_layer(activations) -> None:
    parts = [int8_layer(n, seed=i) for i, n in enumerate((128, 32, 32))]
    for part in parts:
        part.activations = activations
    fused = fuse_linears(*parts)
    assert isinstance(fused, Int8Linear) and fused.qweight.shape == (192, 128)
    assert fused.activations == activations
    x = torch.randn(4, 128)
    with torch.no_grad():  # each row keeps its scale; the per-vector input scale is the same for every part
        torch.testing.assert_close(fused(x), torch.cat([p(x) for p in parts], dim=-1), atol=1e-5, rtol=1e-5)


def test_int8_layers_that_cannot_stack_are_called_one_by_one() -> None:
    mixed = [int8_layer(), int8_layer(bias=False)]
    assert isinstance(fuse_linears(*mixed), ConcatenatedProjections)
    modes = [int8_layer(), int8_layer()]
    modes[1].activations = "int8"
    assert isinstance(fuse_linears(*modes), ConcatenatedProjections)


@pytest.mark.parametrize("group_size", [0, 32])
def test_the_engine_stacks_int8_query_key_value(group_size: int) -> None:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=64, n_layers=2, d_model=64, n_heads=4, context_length=32)
    model = quantize_model(GPT(config), group_size=group_size)
    assert all(isinstance(p, Int8Linear) for p in fast_step_for(model).projections)
    prompt = torch.randint(0, 64, (3, 5))
    fast = generate(model, prompt, max_new_tokens=8, temperature=0.0)
    reference = generate(model, prompt, max_new_tokens=8, temperature=0.0, step="model")
    assert torch.equal(fast, reference)


@needs_fbgemm
def test_set_activations_reaches_every_layer_and_the_engine() -> None:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=64, n_layers=2, d_model=64, n_heads=4, context_length=32)
    model = quantize_model(GPT(config), group_size=0)  # a scale per row: fbgemm's per-vector products
    float_projections = fast_step_for(model).projections
    ids = torch.randint(0, 64, (2, 6))
    with torch.no_grad():
        before = model(ids)
        set_activations(model, "int8")
        after = model(ids)
    modes = {name: m.activations for name, m in model.named_modules() if isinstance(m, Int8Linear)}
    assert modes == {name: "int8x2" if name.endswith(("linear2", "unembedding")) else "int8" for name in modes}
    assert fast_step_for(model).projections is not float_projections
    assert all(p.activations == "int8" for p in fast_step_for(model).projections)
    assert not torch.equal(before, after) and float((after - before).norm() / before.norm()) < 0.05
    prompt = torch.randint(0, 64, (3, 5))
    fast = generate(model, prompt, max_new_tokens=8, temperature=0.0)
    assert torch.equal(fast, generate(model, prompt, max_new_tokens=8, temperature=0.0, step="model"))
    with pytest.raises(Exception, match="activations"):
        set_activations(model, "int4")


# ------------------------------------------------------------------ grouped layers: x in int8 blocks of 32


def grouped_int8_layer(group: int = 32) -> Int8Linear:
    torch.manual_seed(1)
    weight = torch.randn(48, 128) * torch.rand(128).mul(3).exp()
    layer = Int8Linear.from_float(weight, torch.randn(48), group_size=group)
    layer.activations = "int8"
    return layer


@pytest.mark.parametrize("group", [32, 64])
@pytest.mark.parametrize("leading", [(1,), (5,), (2, 20)])
def test_a_grouped_layer_multiplies_the_rounded_x_by_its_dequantized_weights(group, leading) -> None:
    layer = grouped_int8_layer(group)
    assert layer.packed() is None  # fbgemm's packed matrix has a scale per row: not for groups
    x = torch.randn(*leading, 128) * 3
    with torch.no_grad():
        out = layer(x)
    theirs = F.linear(round_blocks(x).double(), layer.weight.double(), layer.bias.double())
    assert out.shape == (*leading, 48)
    if x.numel() > KERNEL_ROWS * 128 and bfloat16_gemm():  # a prompt: x and s Q in bfloat16, 2^-8 of each at most
        spread = F.linear(round_blocks(x).double().abs(), layer.weight.double().abs())
        assert bool(((out.double() - theirs).abs() <= 2 * 2**-8 * spread + 1e-5).all())
    else:
        assert (out.double() - theirs).abs().max() <= 1e-5 * theirs.abs().max()
    exact = F.linear(x.double(), layer.weight.double(), layer.bias.double())
    # |sum_j (x_j - x~_j) W_ij| <= sum_c (d_c / 2) sum_{j in c} |W_ij|, d_c = max_{j in c} |x_j| / 127
    d = x.reshape(*leading, 4, 32).abs().amax(-1).double() / 127  # (..., 4)
    blocks = layer.weight.double().abs().reshape(48, 4, 32).sum(-1)  # (48, 4)
    assert bool(((out.double() - exact).abs() <= d @ blocks.T / 2 + 1e-4).all())


def test_a_grouped_layers_rows_are_independent_of_their_batch() -> None:
    layer = grouped_int8_layer()
    x = torch.randn(8, 128)
    x[5] *= 100
    with torch.no_grad():
        together = layer(x)
        for i in (0, 3, 7):
            alone = layer(x[i : i + 1])[0]  # the same up to BLAS's summation order
            torch.testing.assert_close(alone, together[i], atol=1e-6 * float(together[i].abs().max()), rtol=0)
