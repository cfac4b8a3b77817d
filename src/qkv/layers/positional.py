"""Positional encodings: telling attention where each token sits.

Attention is a set of dot products, blind to order ("you are a boy" and "are you a boy" would look the
same, the encoder-decoder study notes). So position is mixed into the token vectors before the first block:

- sinusoidal (the paper, the notes on the mathematics of attention): a fixed table added to the embeddings,
      PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),   PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model));
- learned absolute positions (GPT-2, BERT): a trainable row per position, added the same way;
- rotary (RoPE): nothing is added; instead each query and key is rotated by an angle proportional to its
  position, so the dot product q_i . k_j depends on i - j. Llama 3.1 and 3.2 slow down the low frequencies
  of the rotation ("llama3" scaling, :func:`rope_frequencies`) to stretch a context trained at 8192 tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from qkv.native import rotary as native_rotary


def sinusoidal_table(max_len: int, d_model: int, *, interleaved: bool = True) -> Tensor:
    """The paper's (max_len, d_model) table: sin in even columns, cos in odd ones.

    ``interleaved=False`` puts all sines first and all cosines after (the layout Marian models use).
    """
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (L, 1)
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (ceil(d/2),)
    angles = position * inv_freq  # (L, ceil(d/2))
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    if interleaved:
        table[:, 0::2] = torch.sin(angles)
        table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    else:
        half = (d_model + 1) // 2
        table[:, :half] = torch.sin(angles)
        table[:, half:] = torch.cos(angles[:, : d_model - half])
    return table.float()


def _counting() -> bool:
    """Whether tensors are made on the meta device, where a model is built only to count its numbers
    (qkv.models.memory): fixed tables are then left empty, as meta's arange is PyTorch's Python reference, whose
    first call imports Dynamo (seconds added to a command)."""
    return torch.get_default_device().type == "meta"


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoidal encodings; ``forward(length, start)`` returns rows start..start+length-1."""

    table: Tensor  # (max_len, d_model), a buffer

    def __init__(self, max_len: int, d_model: int, *, interleaved: bool = True) -> None:
        super().__init__()
        self.max_len = max_len
        table = (
            torch.empty(max_len, d_model)
            if _counting()
            else sinusoidal_table(max_len, d_model, interleaved=interleaved)
        )
        self.register_buffer("table", table, persistent=False)

    def forward(self, length: int, start: int = 0) -> Tensor:
        return self.table[start : start + length]  # (T, d_model)

    def at(self, positions: Tensor) -> Tensor:
        """Rows at ``positions``, a tensor (P,) -> (P, d_model): a decode step whose position is data (one
        compiled graph for every position) rather than a Python number."""
        return self.table[positions]


class LearnedPositionalEncoding(nn.Module):
    """One trainable d_model-vector per absolute position (GPT-2's ``wpe``)."""

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.zeros(max_len, d_model))

    def forward(self, length: int, start: int = 0) -> Tensor:
        return self.weight[start : start + length]  # (T, d_model)

    def at(self, positions: Tensor) -> Tensor:
        """Rows at ``positions``, a tensor (P,) -> (P, d_model) (see :meth:`SinusoidalPositionalEncoding.at`)."""
        return self.weight[positions]


ROPE_SCALINGS = ("llama3",)
"""The RoPE scalings :func:`rope_frequencies` knows (Hugging Face's ``rope_type`` names)."""


def check_rope_scaling(scaling: Mapping[str, Any] | None) -> None:
    """A ValueError unless ``scaling`` is None or names one of :data:`ROPE_SCALINGS`."""
    if scaling is not None and scaling.get("rope_type") not in ROPE_SCALINGS:
        raise ValueError(f"unknown RoPE scaling {scaling.get('rope_type')!r}: one of {', '.join(ROPE_SCALINGS)}")


def rope_frequencies(head_dim: int, base: float = 10000.0, scaling: Mapping[str, Any] | None = None) -> Tensor:
    """RoPE's angular frequencies theta_i = base^(-2i/d), i = 0 .. d/2 - 1, as float64 (d/2,).

    ``scaling={"rope_type": "llama3", "factor": s, "low_freq_factor": l, "high_freq_factor": h,
    "original_max_position_embeddings": L}`` is Llama 3.1's rule, by wavelength 2 pi / theta_i: shorter than
    L / h, unchanged; longer than L / l, divided by s; in between, interpolated by r = (L / wavelength - l) /
    (h - l) as (1 - r) theta_i / s + r theta_i. Fast rotations (local order) stay; slow ones stretch.
    """
    check_rope_scaling(scaling)
    frequencies = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scaling is None:
        return frequencies
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    trained = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / frequencies
    ratio = ((trained / wavelength - low) / (high - low)).clamp(0.0, 1.0)  # 0: slow (divide by s), 1: fast (keep)
    return (1 - ratio) * frequencies / factor + ratio * frequencies


class RotaryEmbedding(nn.Module):
    """cos/sin tables for rotary position embedding over head dimension ``head_dim`` (even); ``scaling`` as
    in :func:`rope_frequencies` (None: none)."""

    cos: Tensor  # (max_len, head_dim), a buffer
    sin: Tensor  # (max_len, head_dim), a buffer

    def __init__(
        self, max_len: int, head_dim: int, *, base: float = 10000.0, scaling: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__()
        self.max_len = max_len
        if _counting():  # the tables left empty; the scaling checked as rope_frequencies would
            check_rope_scaling(scaling)
            cos, sin = torch.empty(max_len, head_dim), torch.empty(max_len, head_dim)  # two: buffers() counts each once
        else:
            inv_freq = rope_frequencies(head_dim, base, scaling)
            angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq  # (L, d/2)
            angles = torch.cat([angles, angles], dim=-1)  # (L, d): the two halves rotate together
            cos, sin = angles.cos().float(), angles.sin().float()
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, length: int, start: int = 0) -> tuple[Tensor, Tensor]:
        return self.cos[start : start + length], self.sin[start : start + length]  # (T, d) each

    def at(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(cos, sin) at ``positions``, a tensor (P,) -> (P, d) each (see :meth:`SinusoidalPositionalEncoding.at`)."""
        return self.cos[positions], self.sin[positions]


def _rotate(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin_signed)


class _Rotate(torch.autograd.Function):
    """y = x cos + roll(x, d/2) sin_signed, with the backward written out (half the kernels of autograd's).

    ``roll`` by half the width swaps the two halves, and ``sin_signed`` carries the minus sign of the first
    half, so this is ``x cos + [-x2, x1] sin``. A rotation's transpose is the rotation back: the gradient is
    ``dy cos + roll(dy sin_signed, d/2)`` (rolling by d/2 twice is the identity).
    """

    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
        ctx.save_for_backward(cos, sin_signed)
        return _rotate(x, cos, sin_signed)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        cos, sin_signed = ctx.saved_tensors
        return (grad * cos).add_((grad * sin_signed).roll(grad.shape[-1] // 2, -1)), None, None


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (x_i, x_{i+d/2}) of ``x`` (..., T, d) by the position's angles:

    x cos + [-x_{d/2:}, x_{:d/2}] sin

    In training, the C library rotates a whole batch's heads in one pass each way where it takes them
    (:mod:`qkv.native.rotary`).
    """
    half = x.shape[-1] // 2
    sin_signed = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
    if torch.is_grad_enabled() and x.requires_grad:
        if native_rotary.applies(x, cos, sin_signed):
            return native_rotary.rotate(x, cos, sin_signed)
        return _Rotate.apply(x, cos, sin_signed)
    return _rotate(x, cos, sin_signed)  # no graph to record: skip the autograd.Function's overhead
