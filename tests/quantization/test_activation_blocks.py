"""x rounded to int8 in blocks of 32: the levels are integers within ±127 on each block's own scale, the error is
at most half a step, and the numbers are the C step's (an int8-activation product by the identity) and, but for
ties, the gguf package's Q8_0 levels."""

from __future__ import annotations

import gguf
import pytest
import torch

from qkv import native
from qkv.quantization import activation_blocks
from qkv.quantization.activation_blocks import round_activations, round_blocks
from qkv.quantization.int8_linear import Int8Linear


def test_levels_are_integers_on_each_blocks_scale_within_half_a_step() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 5, 96)
    x[0, 0, 7] = 50.0  # one large value coarsens its own block only
    ours = round_blocks(x)
    blocks, rounded = x.view(3, 5, 3, 32), ours.view(3, 5, 3, 32)
    step = blocks.abs().amax(-1, keepdim=True) / 127
    levels = rounded / step
    assert torch.allclose(levels, levels.round(), atol=0.02) and levels.abs().max() <= 127.02  # (float32 sums)
    assert bool(((rounded - blocks).abs() <= step / 2 + 1e-6).all())
    assert torch.equal(ours[0, 0, 32:], round_blocks(x[0, 0, 32:]))  # the blocks are independent
    assert ours.shape == x.shape and ours.dtype == x.dtype


def test_zeros_stay_zeros_and_other_widths_are_refused() -> None:
    assert torch.equal(round_blocks(torch.zeros(2, 64)), torch.zeros(2, 64))
    assert round_blocks(torch.zeros(0, 32)).shape == (0, 32)
    with pytest.raises(ValueError, match="multiple"):
        round_blocks(torch.ones(1, 40))


def test_the_c_step_rounds_the_same_numbers() -> None:
    if native.library() is None:
        pytest.skip(f"the C kernels are unavailable: {native.unavailable_reason()}")
    from qkv.decoding.native_step import native_product

    torch.manual_seed(1)
    x = torch.randn(4, 128) * torch.rand(128) * 5
    identity = Int8Linear.from_float(torch.eye(128), None)  # q = 127 on the diagonal, s = 1 / 127
    identity.activations = "int8"
    theirs = native_product(identity, x)  # the C step's d xq, times 127 / 127
    assert torch.allclose(theirs, round_blocks(x), rtol=1e-6, atol=1e-7)


def test_x_is_rounded_in_blocks_of_32_as_ggufs_q8_0_rounds_it() -> None:
    """The same levels as the gguf package's Q8_0 quantizer (d = max|x_c| / 127, round(x / d)), except at exact
    ties (it rounds them away from zero, the C step to even) and an ulp of 1 / d; a block of zeros stays zeros."""
    torch.manual_seed(0)
    x = torch.randn(6, 256) * torch.rand(6, 256).mul(3).exp()
    x[2, 32:64] = 0
    ours = round_blocks(x)
    blocks = torch.from_numpy(gguf.quants.quantize(x.numpy(), gguf.GGMLQuantizationType.Q8_0)).reshape(6, 8, 34)
    theirs = blocks[..., 2:].contiguous().view(torch.int8).float()  # (6, 8, 32) levels
    top = x.reshape(6, 8, 32).abs().amax(-1, keepdim=True)
    levels = torch.round(ours.reshape(6, 8, 32) * torch.where(top > 0, 127 / top, torch.zeros_like(top)))
    assert (levels - theirs).abs().max() <= 1 and (levels != theirs).float().mean() < 1e-3
    assert not ours[2, 32:64].any() and ours.shape == x.shape
    assert bool(((ours - x).abs() <= top.repeat_interleave(32, dim=-1).reshape(6, 256) / 127 / 2 * 1.0001).all())


def test_the_c_library_rounds_a_prompts_rows_as_pytorch_does(monkeypatch) -> None:
    """Many rows (a prompt) are rounded by the C library in one pass: bit for bit PyTorch's numbers, ties to even."""
    if native.library() is None:
        pytest.skip(f"the C kernels are unavailable: {native.unavailable_reason()}")
    torch.manual_seed(2)
    x = torch.randn(80, 96) * torch.rand(96).mul(3).exp()
    x[:, 0] = 127.0  # d = 1 in the first block: its other values are their own levels' positions
    x[:, 1:32] = torch.arange(31) - 14.5  # halfway between two levels
    x[7, 32:64] = 0
    assert activation_blocks._native_applies(x)
    ours = round_blocks(x)
    assert torch.equal(ours[:, 1:32], torch.round(x[:, 1:32])) and not bool(ours[:, 1:32].remainder(2).any())
    twice = round_activations(x, "int8x2")  # in one pass of the C library, the three of PyTorch below
    monkeypatch.setattr(activation_blocks, "_native_applies", lambda x: False)
    assert torch.equal(ours, round_blocks(x))
    assert torch.equal(twice, round_activations(x, "int8x2")) and not torch.equal(twice, ours)


def test_rounding_twice_leaves_at_most_half_of_the_second_step() -> None:
    """int8x2: x ~ d xq + d' xq', xq' the first rounding's error rounded on the step d' = d / 254 with |xq'| <= 127,
    so the error is at most d' / 2 a value; zeros stay zeros."""
    torch.manual_seed(2)
    x = torch.randn(4, 96) * torch.rand(96).mul(3).exp()
    x[0, 3] = 80.0
    once, twice = round_blocks(x), round_activations(x, "int8x2")
    second = x.view(4, 3, 32).abs().amax(-1, keepdim=True) / 127 / 254
    assert bool(((twice - x).view(4, 3, 32).abs() <= second / 2 * (1 + 1e-5)).all())
    levels = (twice - once).view(4, 3, 32) / second  # xq': integers within int8
    assert torch.allclose(levels, levels.round(), atol=0.02) and levels.abs().max() <= 127.02  # (float32 sums)
    assert (twice - x).abs().max() < (once - x).abs().max() / 100  # the first rounding's error, nearly all gone
    assert torch.equal(round_activations(x, "int8"), once)
    assert torch.equal(round_activations(torch.zeros(2, 64), "int8x2"), torch.zeros(2, 64))


def test_the_c_step_rounds_twice_as_pytorch_does() -> None:
    """An int8x2 product by the identity gives the two roundings' sum (the C step adds W times each)."""
    if native.library() is None:
        pytest.skip(f"the C kernels are unavailable: {native.unavailable_reason()}")
    from qkv.decoding.native_step import native_product

    torch.manual_seed(3)
    x = torch.randn(4, 128) * torch.rand(128) * 5
    identity = Int8Linear.from_float(torch.eye(128), None, group_size=32)
    identity.activations = "int8x2"
    theirs = native_product(identity, x)
    assert torch.allclose(theirs, round_activations(x, "int8x2"), rtol=1e-6, atol=1e-7)
    assert not torch.allclose(theirs, round_blocks(x), rtol=1e-6, atol=1e-7)
