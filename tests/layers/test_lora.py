"""LoRALinear: y = W x + b + (alpha / r) B A dropout(x) as written out with torch, PEFT's initialisation, the merged
layer, a shared A, the fused decoding rule, and an int8 base whose gradient equals the float product's."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from qkv.layers import lora_product
from qkv.layers.fused import fuse_linears
from qkv.layers.linear import Linear, packs
from qkv.layers.lora import FusedLoRA, LoRALinear, merged
from qkv.quantization.int8_linear import Int8Linear


def randomized(layer: LoRALinear) -> LoRALinear:
    """B is zero at the start (the layer equals its base): give it values so that the update shows."""
    with torch.no_grad():
        layer.lora_B.normal_(0, 0.5)
    return layer


@pytest.mark.parametrize("bias", [True, False])
def test_forward_is_the_base_plus_the_scaled_low_rank_update(bias: bool) -> None:
    base = Linear(12, 20, bias=bias).double()
    layer = randomized(LoRALinear(base, rank=3, alpha=6).double())
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    expected = F.linear(x, base.weight, base.bias) + 2.0 * (x @ layer.lora_A.T) @ layer.lora_B.T  # alpha / r = 2
    torch.testing.assert_close(layer(x), expected)
    torch.testing.assert_close(F.linear(x, layer.weight, layer.bias), expected)  # weight: W + (alpha / r) B A


@pytest.mark.parametrize("shape", [(3, 40, 48), (48,), (0, 48)])
@pytest.mark.parametrize("whole", [True, False])
def test_training_gradients_equal_autograd_through_the_written_out_update(shape, whole: bool, monkeypatch) -> None:
    """float32, a frozen base that takes the packed product: the layer is one autograd function (``whole``), or the
    update is added by one addmm; the gradients of x, A and B are autograd's through W x + b + scaling (x A^T) B^T in
    float64."""
    if not whole:
        monkeypatch.setattr(lora_product, "applies", lambda *a: False)
    layer = randomized(LoRALinear(Linear(48, 80), rank=4, alpha=12))
    x = torch.randn(shape, requires_grad=True)
    out = layer(x)
    assert out.shape == (*shape[:-1], 80)
    assert (type(out.grad_fn).__name__ == "LoRAProductBackward") == (whole and packs(layer.base.weight))
    seed = torch.randn(out.shape)
    (out * seed).sum().backward()
    x64 = x.detach().double().requires_grad_()
    a64, b64 = (p.detach().double().requires_grad_() for p in (layer.lora_A, layer.lora_B))
    base = layer.base
    expected = F.linear(x64, base.weight.double(), base.bias.double()) + 3.0 * (x64 @ a64.T) @ b64.T
    (expected * seed.double()).sum().backward()
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    for got, want in ((x.grad, x64.grad), (layer.lora_A.grad, a64.grad), (layer.lora_B.grad, b64.grad)):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


def test_only_the_adapters_take_gradients_when_x_needs_none() -> None:
    layer = randomized(LoRALinear(Linear(16, 24), rank=2, alpha=4))
    x = torch.randn(5, 16)  # the first layer's input when the embedding is frozen
    layer(x).sum().backward()
    assert layer.lora_A.grad is not None and layer.lora_B.grad is not None and x.grad is None
    expected = torch.autograd.grad(
        (F.linear(x, layer.base.weight, layer.base.bias) + 2.0 * (x @ layer.lora_A.T) @ layer.lora_B.T).sum(),
        (layer.lora_A, layer.lora_B),
    )
    torch.testing.assert_close(layer.lora_A.grad, expected[0])
    torch.testing.assert_close(layer.lora_B.grad, expected[1])


def test_a_second_derivative_through_the_whole_layer_is_refused_not_zero() -> None:
    layer = randomized(LoRALinear(Linear(16, 24), rank=2, alpha=4))
    if not packs(layer.base.weight):
        pytest.skip("no oneDNN: autograd's own road, which differentiates twice")
    x = torch.randn(5, 16, requires_grad=True)
    (dx,) = torch.autograd.grad(layer(x).pow(2).sum(), (x,), create_graph=True)
    with pytest.raises(RuntimeError):
        dx.sum().backward()


def test_under_bfloat16_autocast_the_update_is_added_in_the_base_output_type() -> None:
    layer = randomized(LoRALinear(Linear(32, 16), rank=2, alpha=4))
    x = torch.randn(5, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), layer(x), atol=0.1, rtol=0.05)


def test_starts_as_peft_does_b_zero_and_a_kaiming_uniform() -> None:
    layer = LoRALinear(Linear(64, 32), rank=8, alpha=16)
    assert torch.count_nonzero(layer.lora_B) == 0
    bound = 1 / math.sqrt(64)  # kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as nn.Linear
    assert layer.lora_A.abs().max() <= bound and layer.lora_A.abs().max() > 0.8 * bound
    x = torch.randn(3, 64)
    torch.testing.assert_close(layer(x), layer.base(x))


def test_only_the_adapters_train() -> None:
    layer = LoRALinear(Linear(8, 8), rank=2, alpha=2)
    assert [name for name, p in layer.named_parameters() if p.requires_grad] == ["lora_A", "lora_B"]
    randomized(layer)(torch.randn(4, 8)).sum().backward()
    assert layer.base.weight.grad is None and layer.lora_A.grad is not None and layer.lora_B.grad is not None


def test_merged_layer_computes_the_same() -> None:
    layer = randomized(LoRALinear(Linear(16, 24), rank=4, alpha=8))
    x = torch.randn(7, 16)
    plain = merged(layer)
    assert type(plain) is Linear
    torch.testing.assert_close(plain(x), layer(x), atol=1e-5, rtol=1e-5)


def test_projections_may_share_one_a() -> None:
    first = LoRALinear(Linear(8, 8), rank=2, alpha=2)
    second = LoRALinear(Linear(8, 4), rank=2, alpha=2, shared_a=first.lora_A)
    assert second.lora_A is first.lora_A
    with pytest.raises(ValueError, match="shared A"):
        LoRALinear(Linear(6, 4), rank=2, alpha=2, shared_a=first.lora_A)


@pytest.mark.parametrize("lora", [(0, 1, 2), (0, 2), (1,)])
def test_fused_rule_equals_the_projections_one_by_one(lora: tuple[int, ...]) -> None:
    """W_q, W_k, W_v with LoRA on some of them: one module for the decoding step, the same numbers."""
    layers = [Linear(16, n) for n in (16, 8, 8)]
    layers = [randomized(LoRALinear(m, rank=2, alpha=4)) if i in lora else m for i, m in enumerate(layers)]
    fused = fuse_linears(*layers)
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), torch.cat([m(x) for m in layers], dim=-1))
    assert isinstance(fused, FusedLoRA) == (0 in lora)


def test_an_int8_base_takes_the_gradient_of_its_dequantized_matrix_and_keeps_no_float_copy() -> None:
    """dL/dx through the int8 base equals autograd's through the float product with s Q (its dequantized matrix);
    the graph saves the int8 matrix, not a widened float copy of it."""
    float_layer = Linear(32, 48)
    base = Int8Linear.from_float(float_layer.weight, float_layer.bias)
    layer = randomized(LoRALinear(base, rank=4, alpha=8))
    x = torch.randn(5, 32, requires_grad=True)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = layer(x)
    (out * torch.linspace(-1, 1, 48)).sum().backward()
    assert not any(t.shape == (48, 32) and t.is_floating_point() for t in saved)
    x_ref = x.detach().clone().requires_grad_(True)
    reference = F.linear(x_ref, base.weight, base.bias) + 2.0 * (x_ref @ layer.lora_A.T) @ layer.lora_B.T
    (reference * torch.linspace(-1, 1, 48)).sum().backward()
    torch.testing.assert_close(out, reference, atol=2e-2, rtol=2e-2)  # the forward rounds x to bfloat16
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-5, rtol=1e-5)
    assert base.qweight.grad is None and layer.lora_A.grad is not None


def test_a_hook_on_the_base_still_sees_its_input() -> None:
    layer = randomized(LoRALinear(Linear(16, 24), rank=2, alpha=4))
    seen = []
    layer.base.register_forward_hook(lambda module, args, out: seen.append(args[0].shape))
    x = torch.randn(3, 5, 16, requires_grad=True)
    out = layer(x)
    expected = F.linear(x, layer.base.weight, layer.base.bias) + 2.0 * (x @ layer.lora_A.T) @ layer.lora_B.T
    assert seen and torch.allclose(out, expected, atol=1e-5)
