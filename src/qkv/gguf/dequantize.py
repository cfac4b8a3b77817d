"""Dequantizing GGUF tensors: ggml's block formats turned back into float32, one vectorized function per type.

A quantized tensor is a run of blocks; each block holds ``block_size`` numbers as small integers q plus one
or a few float16 scales, and stands for d * q (+ m). Every function here takes the blocks of one type as a
uint8 tensor (n_blocks, type_size) and writes their numbers into a float32 tensor (n_blocks, block_size), in
the order ggml's ``dequantize_row_*`` writes them (ggml-quants.c), with in-place operations on that output
(fresh temporaries of the output's size cost more than the arithmetic). Most types put the low nibbles of a
run of bytes first, then their high nibbles; each docstring gives its block's layout.

:func:`dequantize` applies the right one to a :class:`~qkv.gguf.reader.RawTensor`, a slice of blocks at a
time, straight into a float32 tensor it is given (a model's parameter), so that no second float copy of a
large tensor is ever made.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import Tensor

from qkv.errors import QkvError
from qkv.gguf.reader import RawTensor

CHUNK_NUMBERS = 1 << 20  # numbers dequantized per slice: 4 MB of float32 at a time


def _words(blocks: Tensor) -> Tensor:
    """The blocks (n, type_size) read as little-endian int16 words (n, type_size / 2), no copy."""
    return blocks.view(torch.int16)


def _f16(blocks: Tensor, word: int) -> Tensor:
    """The float16 in word ``word`` (bytes 2 word, 2 word + 1) of every block, as float32 (n, 1)."""
    return _words(blocks)[:, word : word + 1].view(torch.float16).float()


def _nibbles(words: Tensor) -> tuple[Tensor, Tensor]:
    """int16 words (n, k) -> the low and the high nibble of each of their 2k bytes, as uint8 (n, 2k) each, in
    byte order. (Shifting a word by 4 moves each byte's high nibble down; the mask drops what crossed over.)"""
    low = (words & 0x0F0F).view(torch.uint8)
    high = ((words >> 4) & 0x0F0F).view(torch.uint8)
    return low, high


def dequantize_f32(blocks: Tensor, out: Tensor) -> None:
    """F32: 4 bytes per number, IEEE single precision, little-endian."""
    out.copy_(blocks.view(torch.float32))


def dequantize_f16(blocks: Tensor, out: Tensor) -> None:
    """F16: 2 bytes per number, IEEE half precision."""
    out.copy_(blocks.view(torch.float16))


def dequantize_bf16(blocks: Tensor, out: Tensor) -> None:
    """BF16: 2 bytes per number, the upper half of a float32 (sign, 8 exponent bits, 7 mantissa bits)."""
    bits = out.view(torch.int32)
    bits.copy_(blocks.view(torch.int16))
    bits.bitwise_left_shift_(16)


def dequantize_q8_0(blocks: Tensor, out: Tensor) -> None:
    """Q8_0, 32 numbers in 34 bytes: d (f16), then 32 signed bytes q; x = q * d."""
    out.copy_(blocks[:, 2:].view(torch.int8))
    out.mul_(_f16(blocks, 0))


def dequantize_q4_0(blocks: Tensor, out: Tensor) -> None:
    """Q4_0, 32 numbers in 18 bytes: d (f16), then 16 bytes of 4-bit q (numbers 0-15 in the low nibbles,
    16-31 in the high ones); x = d * (q - 8)."""
    out[:, :16], out[:, 16:] = _nibbles(_words(blocks)[:, 1:])
    out.sub_(8.0).mul_(_f16(blocks, 0))


def dequantize_q4_1(blocks: Tensor, out: Tensor) -> None:
    """Q4_1, 32 numbers in 20 bytes: d and m (f16), then 16 bytes of 4-bit q (low nibbles: numbers 0-15,
    high: 16-31); x = d * q + m."""
    out[:, :16], out[:, 16:] = _nibbles(_words(blocks)[:, 2:])
    out.mul_(_f16(blocks, 0)).add_(_f16(blocks, 1))


def k_scales(packed: Tensor) -> tuple[Tensor, Tensor]:
    """The 12 scale bytes of Q4_K / Q5_K -> 8 six-bit scales and 8 six-bit mins, float32 (n, 8, 1) each.

    Bytes 0-3 hold scales 0-3 (low 6 bits), bytes 4-7 mins 0-3; bytes 8-11 hold scales 4-7 (low nibble) and
    mins 4-7 (high nibble), whose top 2 bits are the top 2 bits of bytes 0-3 (scales) and 4-7 (mins)."""
    low, high, rest = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat([low & 63, (rest & 0x0F) | ((low >> 6) << 4)], dim=1)
    mins = torch.cat([high & 63, (rest >> 4) | ((high >> 6) << 4)], dim=1)
    return scales.float()[..., None], mins.float()[..., None]


def _k_low_bits(words: Tensor, out: Tensor) -> None:
    """128 bytes of 4-bit q (64 words) -> ``out`` (n, 8, 32): each run of 32 bytes holds sub-block 2j in its
    low nibbles and sub-block 2j + 1 in its high ones."""
    low, high = _nibbles(words)
    pairs = out.view(-1, 4, 2, 32)
    pairs[:, :, 0], pairs[:, :, 1] = low.view(-1, 4, 32), high.view(-1, 4, 32)


def dequantize_q4_k(blocks: Tensor, out: Tensor) -> None:
    """Q4_K, 256 numbers in 144 bytes: d, dmin (f16), 12 bytes of 6-bit scales s and mins m for 8 sub-blocks
    of 32 (:func:`k_scales`), 128 bytes of 4-bit q (:func:`_k_low_bits`); x = d s q - dmin m."""
    scales, mins = k_scales(blocks[:, 4:16])
    q = out.view(-1, 8, 32)
    _k_low_bits(_words(blocks)[:, 8:72], q)
    q.mul_(_f16(blocks, 0)[..., None] * scales).sub_(_f16(blocks, 1)[..., None] * mins)


def dequantize_q5_k(blocks: Tensor, out: Tensor) -> None:
    """Q5_K, 256 numbers in 176 bytes: as Q4_K (d, dmin, 12 scale bytes, 128 bytes of low 4 bits), with 32
    bytes qh between the scales and the low bits: bit j of qh[l] is the fifth bit of number l of sub-block j."""
    scales, mins = k_scales(blocks[:, 4:16])
    q = out.view(-1, 8, 32)
    _k_low_bits(_words(blocks)[:, 24:88], q)
    shifts = torch.arange(8, dtype=torch.uint8).view(1, 8, 1)
    q.add_(((blocks[:, 16:48].unsqueeze(1) >> shifts) & 1) << 4)  # (n, 8, 32): 16 where the fifth bit is set
    q.mul_(_f16(blocks, 0)[..., None] * scales).sub_(_f16(blocks, 1)[..., None] * mins)


def dequantize_q6_k(blocks: Tensor, out: Tensor) -> None:
    """Q6_K, 256 numbers in 210 bytes: 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 signed
    8-bit scales s (one per 16 numbers), d (f16); x = d s (q - 32).

    Each half of 128 numbers uses 64 ql bytes, 32 qh bytes and 8 scales: number l + 32 t (l < 32) takes the
    low nibble of ql[l] (t = 0), of ql[l + 32] (t = 1), the high nibble of ql[l] (t = 2), of ql[l + 32]
    (t = 3), and bits 2t, 2t + 1 of qh[l]."""
    n = blocks.shape[0]
    low, high = _nibbles(_words(blocks)[:, :64])  # (n, 128) each: byte b of ql -> half b // 64, t, l
    q = out.view(n, 2, 4, 32)
    q[:, :, 0:2], q[:, :, 2:4] = low.view(n, 2, 2, 32), high.view(n, 2, 2, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)
    q.add_(((blocks[:, 128:192].reshape(n, 2, 1, 32) >> shifts) & 3) << 4).sub_(32.0)
    scales = blocks[:, 192:208].view(torch.int8).float().view(n, 2, 4, 2, 1)  # (half, t, l // 16)
    q.view(n, 2, 4, 2, 16).mul_(_f16(blocks, 104).view(n, 1, 1, 1, 1) * scales)


DEQUANTIZERS: dict[str, Callable[[Tensor, Tensor], None]] = {
    "F32": dequantize_f32,
    "F16": dequantize_f16,
    "BF16": dequantize_bf16,
    "Q8_0": dequantize_q8_0,
    "Q4_0": dequantize_q4_0,
    "Q4_1": dequantize_q4_1,
    "Q4_K": dequantize_q4_k,
    "Q5_K": dequantize_q5_k,
    "Q6_K": dequantize_q6_k,
}
"""ggml type name -> its dequantizer ``(blocks (n, type_size) uint8, out (n, block_size) float32)``."""


def _as_torch(blocks: np.ndarray) -> Tensor:
    with warnings.catch_warnings():  # the file is mapped read-only, and nothing here writes to it
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(blocks)


def dequantize(raw: RawTensor, out: Tensor | None = None) -> Tensor:
    """``raw`` as float32 of its shape, written into ``out`` (a float32 tensor of that many numbers) if given.

    A type qkv does not read is a QkvError naming it and the tensor."""
    function = DEQUANTIZERS.get(raw.type)
    if function is None:
        raise QkvError(
            f"tensor {raw.name} is stored as {raw.type}, which qkv cannot dequantize (it reads "
            f"{', '.join(DEQUANTIZERS)}): use a file quantized to one of those"
        )
    if out is None:
        out = torch.empty(raw.shape, dtype=torch.float32)
    if out.dtype != torch.float32 or out.numel() != raw.numel or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous float32 tensor of {raw.numel} numbers")
    n_blocks, block_size = raw.blocks.shape[0], raw.numel // max(raw.blocks.shape[0], 1)
    flat = out.view(n_blocks, block_size)
    step = max(1, CHUNK_NUMBERS // block_size)
    blocks = _as_torch(raw.blocks)
    for start in range(0, n_blocks, step):
        function(blocks[start : start + step], flat[start : start + step])
    return out.view(raw.shape)


@contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one thread inside (restored after). Dequantizing is memory-bound byte unpacking, and on a
    busy machine two OpenMP threads wait for each other at every small operation: loading SmolLM2's tensors
    took 5 to 30 s on two threads and 0.7 to 4 s on one (2 shared cores, measured under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
