"""Llama 3's RoPE factors (rope_freqs.weight) against the loop llama.cpp's converter runs, and read back."""

from __future__ import annotations

import math

import pytest
import torch

from qkv.errors import QkvError
from qkv.gguf.rope import rope_factors, scaling_from_factors

LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}  # fmt: skip


def converter_factors(head_dim: int, base: float, factor: float, low: float, high: float, old: int) -> list[float]:
    """convert_hf_to_gguf.py's LlamaModel rope_freqs loop (Llama 3.2 1B: head_dim 64, base 500000, factor 32)."""
    factors = []
    for i in range(0, head_dim, 2):
        wavelength = 2 * math.pi * base ** (i / head_dim)
        if wavelength < old / high:
            factors.append(1.0)
        elif wavelength > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return factors


def test_factors_are_the_converters():
    expected = torch.tensor(converter_factors(64, 500000.0, 32.0, 1.0, 4.0, 8192))
    assert torch.allclose(rope_factors(64, 500000.0, LLAMA3), expected, rtol=1e-6)
    assert scaling_from_factors(expected, 64, 500000.0) == LLAMA3


def test_no_scaling_and_other_rules():
    assert scaling_from_factors(torch.ones(32), 64, 500000.0) is None
    with pytest.raises(QkvError, match="not Llama 3's rule"):
        scaling_from_factors(torch.tensor(converter_factors(64, 500000.0, 8.0, 2.0, 8.0, 8192)), 64, 500000.0)
    with pytest.raises(QkvError, match="not 32"):
        scaling_from_factors(torch.ones(16), 64, 500000.0)
