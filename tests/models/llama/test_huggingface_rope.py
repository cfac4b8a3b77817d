"""Llama 3's RoPE scaling ("llama3", used by Llama 3.1 and 3.2) in qkv's RotaryEmbedding equals transformers'."""

from __future__ import annotations

import pytest
import torch

from qkv.layers.positional import RotaryEmbedding, rope_frequencies

transformers = pytest.importorskip("transformers")

LLAMA_3_2 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 8192}  # fmt: skip


def _hf_rotary(head_dim: int, theta: float, scaling: dict | None, context: int) -> torch.nn.Module:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rope = {"rope_type": "default", "rope_theta": theta} if scaling is None else {**scaling, "rope_theta": theta}
    config = transformers.LlamaConfig(
        hidden_size=head_dim * 4, num_attention_heads=4, max_position_embeddings=context, rope_parameters=rope
    )
    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_llama3_frequencies_match_transformers(head_dim: int) -> None:
    hf = _hf_rotary(head_dim, 500000.0, LLAMA_3_2, 131072)
    ours = rope_frequencies(head_dim, 500000.0, LLAMA_3_2)
    torch.testing.assert_close(ours.float(), hf.inv_freq, rtol=1e-6, atol=0)
    plain = rope_frequencies(head_dim, 500000.0)
    assert (ours < plain).any() and (ours == plain).any()  # slow rotations stretched, fast ones kept


def test_llama3_cos_sin_match_transformers() -> None:
    hf = _hf_rotary(64, 500000.0, LLAMA_3_2, 131072)
    ours = RotaryEmbedding(256, 64, base=500000.0, scaling=LLAMA_3_2)
    positions = torch.arange(256)[None]
    cos, sin = hf(torch.zeros(1, 256, 64), positions)
    torch.testing.assert_close(ours.cos, cos[0], atol=2e-5, rtol=0)
    torch.testing.assert_close(ours.sin, sin[0], atol=2e-5, rtol=0)
    unscaled = RotaryEmbedding(256, 64, base=500000.0)
    assert (unscaled.cos - cos[0]).abs().max() > 1e-3  # the comparison can fail


def test_unknown_scaling_is_refused() -> None:
    yarn = {"rope_type": "yarn", "factor": 4.0}
    with pytest.raises(ValueError, match="unknown RoPE scaling 'yarn'"):
        rope_frequencies(64, 10000.0, yarn)
    for device in ("cpu", "meta"):  # meta: a model built only to count its numbers leaves the tables empty
        with torch.device(device), pytest.raises(ValueError, match="unknown RoPE scaling 'yarn'"):
            RotaryEmbedding(16, 64, scaling=yarn)
