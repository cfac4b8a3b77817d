"""Llama 3.1's scaled RoPE in a GGUF file: the tensor ``rope_freqs.weight``, one factor per frequency.

qkv computes Llama 3's rule from four numbers (:func:`qkv.layers.positional.rope_frequencies`: ``factor`` s,
``low_freq_factor`` l, ``high_freq_factor`` h, ``original_max_position_embeddings`` L); llama.cpp's converter
stores its outcome instead, theta_i / f_i with f_i = 1 for fast rotations, s for slow ones and
1 / ((1 - r) / s + r) in between. Reading, qkv takes s = max f_i and the numbers every Llama 3.x release uses
(l = 1, h = 4, L = 8192, or the file's rope.scaling.original_context_length), and accepts them only when
they give back every f_i; otherwise the file is refused in one line.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from qkv.errors import QkvError
from qkv.layers.positional import rope_frequencies

ROPE_FREQS = "rope_freqs.weight"


def rope_factors(head_dim: int, base: float, scaling: dict[str, Any]) -> Tensor:
    """llama.cpp's rope_freqs for ``scaling``: each plain frequency over its scaled one, float32 (head_dim / 2,)."""
    return (rope_frequencies(head_dim, base) / rope_frequencies(head_dim, base, scaling)).float()


def scaling_from_factors(found: Tensor, head_dim: int, base: float, original: int = 8192) -> dict[str, Any] | None:
    """The llama3 rope_scaling whose factors are ``found`` (None when every factor is 1); QkvError when none is."""
    if found.shape != (head_dim // 2,) or not torch.isfinite(found).all() or (found <= 0).any():
        wanted = head_dim // 2
        raise QkvError(f"{ROPE_FREQS} holds {list(found.shape)} factors, not {wanted} (head_dim / 2) positive ones")
    if torch.all(found == 1):
        return None
    scaling = {"rope_type": "llama3", "factor": float(found.max()), "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": original}  # fmt: skip
    if not torch.allclose(rope_factors(head_dim, base, scaling), found.float(), rtol=1e-4):
        raise QkvError(
            f"the file scales RoPE per frequency ({ROPE_FREQS}) by factors that are not Llama 3's rule with "
            "low_freq_factor 1 and high_freq_factor 4: qkv cannot run this model"
        )
    return scaling
