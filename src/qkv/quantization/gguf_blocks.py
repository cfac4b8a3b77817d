"""GGUF's quantized blocks (llama.cpp's ggml formats) read into qkv's int4 and int8 layers.

A GGUF matrix of shape (N, K) (GGUF lists it as [K, N]) is stored row by row, each row in blocks of 32
consecutive weights. The three block kinds of a Q4_0 / Q4_1 model file:

    Q4_0  18 bytes: d (float16), 16 bytes of levels q in 0..15        w = d (q - 8)
    Q4_1  20 bytes: d, m (float16), 16 bytes of levels q in 0..15     w = d q + m
    Q8_0  34 bytes: d (float16), 32 int8 levels q                     w = d q

In the 16 bytes of a Q4 block, byte j holds weight j of the block in its low four bits and weight j + 16 in its
high four. Both Q4 kinds are int4 groups of 32 in qkv's form (w = s q + m, s and m float16,
:mod:`qkv.quantization.int4_linear`): Q4_1 as it is, Q4_0 with m = -8 d (exact in float16: a power of two).

Q4_K (llama.cpp's "K-quants", 144 bytes for 256 weights: d, dmin, eight 6-bit scales and mins, 4-bit levels) is
eight groups of 32 with w = (d sc) q - (dmin mn): int4 groups with s = d sc and m = -dmin mn, the same levels;
only s and m are rounded to float16 (d sc needs up to 17 bits), which moves a weight by at most 2^-11 of
|s| q + |m|, a small part of the half step Q4_K itself rounds to.

Q8_0 has a scale per 32 weights: :func:`q8_0_levels` gives the blocks as they are, and
:meth:`Int8Linear.from_gguf <qkv.quantization.int8_linear.Int8Linear.from_gguf>` keeps them as an int8 layer
with groups of 32 (the float16 d widened to float32), so its weights are exactly the file's d q.

``data`` is the tensor's raw bytes as ``gguf.GGUFReader`` gives them (``tensor.data``: uint8, (N, bytes per
row)); a reader that permutes rows (Llama's W_q and W_k for rotary halves) can permute ``data``'s rows first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from qkv.errors import QkvError
from qkv.gguf.dequantize import dequantize_q4_k, k_scales

BLOCK = 32  # weights per block
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34, "Q4_K": 144}
BLOCK_WEIGHTS = {"Q4_0": 32, "Q4_1": 32, "Q8_0": 32, "Q4_K": 256}
INT4_KINDS = ("Q4_0", "Q4_1", "Q4_K")
Q4_OFFSET = 8  # Q4_0 reads a level q as q - 8


def _blocks(data: object, kind: str, shape: Sequence[int]) -> Tensor:
    """The raw bytes as (N, K / 32, bytes per block) uint8, after checking ``kind`` and the sizes."""
    if kind not in BLOCK_BYTES:
        raise QkvError(f"GGUF block kind {kind!r}: qkv reads {', '.join(BLOCK_BYTES)} blocks into int4 and int8 layers")
    n_out, n_in = (int(n) for n in shape)
    size = BLOCK_WEIGHTS[kind]
    if n_in % size:
        raise QkvError(f"a {kind} matrix of {n_in} columns: its blocks hold {size} weights, so the file is damaged")
    if isinstance(data, Tensor):
        raw = data.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    else:  # a numpy array (GGUFReader's memory map: read-only, so copied)
        raw = torch.from_numpy(np.ascontiguousarray(data).view(np.uint8).reshape(-1).copy())
    expected = n_out * (n_in // size) * BLOCK_BYTES[kind]
    if raw.numel() != expected:
        raise QkvError(
            f"a {kind} matrix of shape ({n_out}, {n_in}) takes {expected} bytes, and {raw.numel()} were given: "
            "the tensor's data and shape do not match (the file is damaged or was read wrongly)"
        )
    return raw.view(n_out, n_in // size, BLOCK_BYTES[kind])


def _float16(blocks: Tensor, start: int) -> Tensor:
    """The float16 stored at byte ``start`` of every block: (N, blocks)."""
    return blocks[..., start : start + 2].contiguous().view(torch.float16).squeeze(-1)


def q4_groups(data: object, kind: str, shape: Sequence[int]) -> tuple[Tensor, Tensor, Tensor]:
    """Q4_0 or Q4_1 blocks as int4 groups of 32: (levels uint8 (N, K) in 0..15, s float16 (N, K / 32),
    m float16 (N, K / 32)), w = s q + m; :meth:`Int4Linear.from_gguf
    <qkv.quantization.int4_linear.Int4Linear.from_gguf>` packs the levels two a byte."""
    if kind in BLOCK_BYTES and kind not in INT4_KINDS:
        raise QkvError(f"{kind} blocks are not 4-bit: int4 layers take Q4_0, Q4_1 or Q4_K (Q8_0 goes to an int8 layer)")
    blocks = _blocks(data, kind, shape)
    n_out, n_in = (int(n) for n in shape)
    if kind == "Q4_K":
        return _q4_k_groups(blocks.reshape(-1, BLOCK_BYTES[kind]), n_out, n_in)
    scale = _float16(blocks, 0)  # (N, K / 32)
    if kind == "Q4_1":
        minimum, nibbles = _float16(blocks, 2), blocks[..., 4:]
    else:
        minimum, nibbles = scale * -Q4_OFFSET, blocks[..., 2:]  # -8 d: a power of two, exact in float16
    levels = torch.cat([nibbles & 15, nibbles >> 4], dim=-1)  # (N, K / 32, 32): weights 0..15, then 16..31
    return levels.reshape(n_out, n_in), scale.contiguous(), minimum.contiguous()


def _q4_k_groups(blocks: Tensor, n_out: int, n_in: int) -> tuple[Tensor, Tensor, Tensor]:
    """Q4_K blocks (n, 144) as int4 groups of 32: the levels of the dequantized weights on each group's grid."""
    weights = torch.empty(blocks.shape[0], 256)
    dequantize_q4_k(blocks, weights)  # (n, 256): (d sc) q - (dmin mn) in float32
    scales, mins = k_scales(blocks[:, 4:16])  # (n, 8, 1) each
    d, dmin = (_float16(blocks[:, None], start).float()[..., None] for start in (0, 2))  # (n, 1, 1)
    step, low = d * scales, -(dmin * mins)  # (n, 8, 1)
    safe = torch.where(step > 0, step, torch.ones_like(step))
    levels = torch.round((weights.view(-1, 8, BLOCK) - low) / safe).clamp_(0, 15)  # exact: the stored q
    levels = torch.where(step > 0, levels, torch.zeros_like(levels)).to(torch.uint8)
    groups = n_in // BLOCK
    return (levels.reshape(n_out, n_in), step.reshape(n_out, groups).half(), low.reshape(n_out, groups).half())


def q8_0_levels(data: object, shape: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Q8_0 blocks as they are: (q int8 (N, K), d float16 (N, K / 32)), w = d q per block of 32."""
    blocks = _blocks(data, "Q8_0", shape)
    n_out, n_in = (int(n) for n in shape)
    return blocks[..., 2:].contiguous().view(torch.int8).reshape(n_out, n_in), _float16(blocks, 0).contiguous()


def dequantize_q8_0(data: object, shape: Sequence[int]) -> Tensor:
    """The float32 matrix (N, K) of Q8_0 blocks: d q."""
    q, d = q8_0_levels(data, shape)
    n_out, n_in = q.shape
    return (q.view(n_out, -1, BLOCK).float() * d.float()[..., None]).view(n_out, n_in)
