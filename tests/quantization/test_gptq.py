"""Calibrated int8 and int4 rounding (GPTQ): it lowers the output error it is built to lower, reduces to nearest
rounding when the inputs are uncorrelated, and quantize_model(calibration=...) uses it for every layer the
calibration reaches (a tied unembedding keeps nearest rounding)."""

from __future__ import annotations

import copy

import pytest
import torch

from qkv.models import GPT, GPTConfig
from qkv.quantization import quantize_model
from qkv.quantization.gptq import gptq_round, gptq_round_groups, input_hessians
from qkv.quantization.int4_linear import dequantize as dequantize_groups
from qkv.quantization.int4_linear import quantize_groups
from qkv.quantization.int8_linear import Int8Linear, dequantize, quantize_per_channel, quantize_per_group


def output_error(x: torch.Tensor, weight: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> float:
    """||x W^T - x (s Q)^T|| / ||x W^T|| in float64."""
    exact = x.double() @ weight.double().T
    return float((exact - x.double() @ (q.double() * scale.double()[:, None]).T).norm() / exact.norm())


def outlier_inputs(rows: int, width: int, generator: torch.Generator) -> torch.Tensor:
    """Correlated inputs with a few large channels, like a transformer's feed-forward activations."""
    mixing = torch.randn(width, width, generator=generator) / width**0.5
    x = torch.randn(rows, width, generator=generator) @ mixing + 0.3 * torch.randn(rows, width, generator=generator)
    x[:, :3] *= 20  # (rows, width)
    return x


def test_calibrated_rounding_lowers_the_output_error_on_unseen_inputs() -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 96, generator=generator) * 0.05
    seen, unseen = outlier_inputs(2500, 96, generator).split([2000, 500])
    nearest, scale = quantize_per_channel(weight)
    calibrated = gptq_round(weight, seen.T @ seen / len(seen), scale)
    assert calibrated.dtype == torch.int8 and calibrated.is_contiguous() and calibrated.shape == nearest.shape
    assert int(calibrated.abs().max()) <= 127
    assert not torch.equal(calibrated, nearest)
    # The same per-row scales; different integers, which cost some per-weight accuracy but cut the output error.
    baseline = output_error(unseen, weight, nearest, scale)
    assert output_error(unseen, weight, calibrated, scale) < 0.9 * baseline
    lightly_damped = gptq_round(weight, seen.T @ seen / len(seen), scale, damping=0.01)  # the paper's damping
    assert output_error(unseen, weight, lightly_damped, scale) < 0.75 * baseline
    assert bool(((lightly_damped.int() - nearest.int()).abs() <= 8).all())


def test_uncorrelated_inputs_give_nearest_rounding() -> None:
    """With a diagonal H no error can be moved usefully onto another column: GPTQ is nearest rounding."""
    weight = torch.randn(20, 64)
    nearest, scale = quantize_per_channel(weight)
    hessian = torch.diag(torch.rand(64) + 0.5)
    hessian[5, 5] = 0  # an input that is always zero
    assert torch.equal(gptq_round(weight, hessian, scale), nearest)


def test_input_hessians_are_the_mean_outer_product_of_each_layers_inputs() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3), torch.nn.Linear(3, 2))
    batches = [torch.randn(4, 7, 6), torch.randn(2, 6)]
    hessians = input_hessians(model, ["0", "2"], lambda m: [m(b) for b in batches])
    assert set(hessians) == {"0", "2"}
    x = torch.cat([b.reshape(-1, 6) for b in batches])
    torch.testing.assert_close(hessians["0"], x.T @ x / len(x))
    hidden = torch.relu(model[0](x)).detach()
    torch.testing.assert_close(hessians["2"], hidden.T @ hidden / len(hidden))
    assert not model[0]._forward_hooks  # the hooks are removed
    assert input_hessians(model, ["3"], lambda m: None) == {}  # a layer that saw nothing is left out


@pytest.mark.parametrize("group_size", [0, 32])
def test_quantize_model_with_calibration_lowers_the_logit_error(group_size) -> None:
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=90, n_layers=2, d_model=64, n_heads=4, context_length=32, tie_embeddings=True)
    ).eval()
    with torch.no_grad():  # large input channels, as trained models have
        for block in model.decoder.blocks:
            block.feed_forward.linear2.weight.mul_(3)
    calibration, held_out = torch.randint(0, 90, (16, 32)), torch.randint(0, 90, (8, 32))
    nearest = quantize_model(copy.deepcopy(model), group_size=group_size)
    calibrated = quantize_model(copy.deepcopy(model), calibration=lambda m: m(calibration), group_size=group_size)
    assert all(m.group_size == group_size for m in calibrated.modules() if isinstance(m, Int8Linear))
    with torch.no_grad():
        exact = model(held_out)
        errors = [float((q(held_out) - exact).norm() / exact.norm()) for q in (nearest, calibrated)]
    assert errors[1] < errors[0]
    # Every linear layer changed its rounding; the unembedding tied to the embedding kept nearest rounding.
    changed = [
        not torch.equal(a.qweight, b.qweight)
        for (name, a), b in zip(nearest.named_modules(), calibrated.modules(), strict=True)
        if isinstance(a, Int8Linear) and name != "unembedding"
    ]
    assert changed and all(changed)
    assert torch.equal(calibrated.unembedding.qweight, nearest.unembedding.qweight)
    assert calibrated.embedding.token_embedding.qweight is calibrated.unembedding.qweight


def int4_output_error(x: torch.Tensor, weight: torch.Tensor, groups: tuple) -> float:
    exact = x.double() @ weight.double().T
    return float((exact - x.double() @ dequantize_groups(*groups, torch.float64).T).norm() / exact.norm())


def test_calibrated_int4_groups_lower_the_output_error_on_unseen_inputs() -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 128, generator=generator) * 0.05
    seen, unseen = outlier_inputs(2500, 128, generator).split([2000, 500])
    nearest = quantize_groups(weight, 32)
    calibrated = gptq_round_groups(weight, seen.T @ seen / len(seen), 32, damping=0.01)
    assert [t.shape for t in calibrated] == [t.shape for t in nearest]
    assert [t.dtype for t in calibrated] == [torch.uint8, torch.float16, torch.float16]
    assert int4_output_error(unseen, weight, calibrated) < 0.75 * int4_output_error(unseen, weight, nearest)


@pytest.mark.parametrize("group_size", [32, 256])
def test_uncorrelated_inputs_give_nearest_int4_rounding(group_size) -> None:
    weight = torch.randn(20, 256)
    hessian = torch.diag(torch.rand(256) + 0.5)
    hessian[5, 5] = 0
    ours, nearest = gptq_round_groups(weight, hessian, group_size), quantize_groups(weight, group_size)
    assert all(torch.equal(a, b) for a, b in zip(ours, nearest, strict=True))


def test_quantize_model_int4_with_calibration_lowers_the_logit_error() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=90, n_layers=2, d_model=64, n_heads=4, context_length=32)).eval()
    with torch.no_grad():
        for block in model.decoder.blocks:
            block.feed_forward.linear2.weight.mul_(3)
    calibration, held_out = torch.randint(0, 90, (16, 32)), torch.randint(0, 90, (8, 32))
    nearest = quantize_model(copy.deepcopy(model), "int4")
    calibrated = quantize_model(copy.deepcopy(model), "int4", calibration=lambda m: m(calibration))
    with torch.no_grad():
        exact = model(held_out)
        errors = [float((q(held_out) - exact).norm() / exact.norm()) for q in (nearest, calibrated)]
    assert errors[1] < errors[0]
    assert not torch.equal(calibrated.decoder.blocks[0].feed_forward.linear2.qweight,
                           nearest.decoder.blocks[0].feed_forward.linear2.qweight)  # fmt: skip


def test_calibrated_rounding_in_int8_groups_lowers_the_output_error_and_is_nearest_without_correlation() -> None:
    """Each column rounds on its group's scale: with outlier inputs the output error drops; with a diagonal H
    GPTQ is nearest rounding, the integers of :func:`quantize_per_group`."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 96, generator=generator) * 0.05
    seen, unseen = outlier_inputs(2500, 96, generator).split([2000, 500])
    nearest, scale = quantize_per_group(weight, 32)
    calibrated = gptq_round(weight, seen.T @ seen / len(seen), scale)
    assert calibrated.dtype == torch.int8 and calibrated.shape == nearest.shape and int(calibrated.abs().max()) <= 127

    def error(q: torch.Tensor) -> float:
        exact = unseen.double() @ weight.double().T
        return float((exact - unseen.double() @ dequantize(q, scale).double().T).norm() / exact.norm())

    assert error(calibrated) < 0.9 * error(nearest)
    assert torch.equal(gptq_round(weight, torch.diag(torch.rand(96) + 0.5), scale), nearest)
