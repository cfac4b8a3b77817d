"""Muon's Newton-Schulz in bfloat16 (the CUDA path) and its split between processes, in one process.

The split itself is checked on two processes in tests/training/test_strategy.py."""

from __future__ import annotations

import pytest
import torch

from qkv.training.muon import newton_schulz_dtype, orthogonalize, orthogonalize_shared


def test_bfloat16_iterations_give_the_float32_result_to_bfloat16_precision() -> None:
    stack = torch.randn(4, 48, 32, generator=torch.Generator().manual_seed(0))
    full = orthogonalize(stack)
    half = orthogonalize(stack, dtype=torch.bfloat16)
    assert half.dtype == torch.float32 and half.shape == stack.shape  # the result keeps the input's dtype
    # bfloat16 keeps 8 bits of mantissa (relative error 2^-8 = 0.004 per rounding): after 5 iterations the
    # entries (about 1/sqrt(48) = 0.14 in size) agree to a few hundredths, and the singular values stay in
    # the band the iteration aims for.
    assert (half - full).abs().max() < 0.03
    singular = torch.linalg.svdvals(half)
    assert singular.min() > 0.5 and singular.max() < 1.3
    cosine = torch.nn.functional.cosine_similarity(half.flatten(1), full.flatten(1), dim=1)
    assert cosine.min() > 0.999


def test_newton_schulz_runs_in_bfloat16_on_cuda_only() -> None:
    assert newton_schulz_dtype(torch.device("cuda", 0)) == torch.bfloat16
    assert newton_schulz_dtype(torch.device("cpu")) == torch.float32


def test_without_a_process_group_the_shared_iteration_is_the_plain_one() -> None:
    stack = torch.randn(3, 16, 24)
    assert torch.equal(orthogonalize_shared(stack), orthogonalize(stack))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bfloat16_on_cuda_matches_float32_on_the_cpu() -> None:
    stack = torch.randn(6, 256, 128)
    on_gpu = orthogonalize(stack.cuda(), dtype=newton_schulz_dtype(torch.device("cuda"))).cpu()
    assert (on_gpu - orthogonalize(stack)).abs().max() < 0.03
