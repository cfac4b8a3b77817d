"""Int8 activations on the fly (W8A8): both factors of x Q^T in int8, the sum in int32, on fbgemm's packed matrix.

Weight-only int8 (:mod:`qkv.quantization.int8_linear`) keeps x in floating point, so every product still
runs at floating-point speed on a widened (or bfloat16-rounded) input. Quantizing x too, one vector at a time,
lets the CPU's int8 dot-product instructions (AVX-512 VNNI: four int8 products per lane per instruction) do
the sum exactly in int32 (the arithmetic CTranslate2's ``int8`` compute type uses):

    a_r = max_j |x_rj|,   x'_r = x_r / a_r  in [-1, 1],
    x'_rj ~ t (X_rj - z)  with X_rj = round(x'_rj / t) + z  in [0, 255],  t = 2 / 255,  z = 127,
    y_ri = sum_j x_rj W_ij + b_i  ~  a_r t s_i sum_j (X_rj - z) Q_ij + b_i.

Each input vector r gets its own scale a_r, so a row's numbers never depend on the other rows of the batch
(a decoding batch gives every sequence the tokens it would get alone). The error per input coordinate is at
most a_r t / 2 (about a_r / 255), on top of the weights' s_i / 2.

**Kernel.** ``torch.ops.quantized.linear_dynamic`` multiplies by a matrix packed once in fbgemm's blocked
layout (:func:`pack`), quantizing its input with one (t, z) for the whole tensor, chosen from the tensor's
minimum and maximum. :func:`dynamic_int8_linear` divides each row by a_r and appends one guard row
(1, -1, 0, ...), so that range is exactly [-1, 1] whatever the rows: t = 2 / 255, z = 127, the same for every
row and every batch. Without VNNI the kernel's 16-bit pair sums could saturate, so the input keeps 7 bits
(``reduce_range``, t = 2 / 127). The packed matrix is a second int8 copy of Q (Q stays, for the state dict
and the weight-only path): this mode costs half the float32 bytes instead of a quarter.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch import Tensor


@functools.cache
def available() -> bool:
    """Whether torch has fbgemm's dynamic int8 linear (x86 CPU builds)."""
    return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(torch.ops.quantized, "linear_dynamic")


@functools.cache
def has_vnni() -> bool:
    """Whether the CPU has int8 dot products without 16-bit saturation (AVX-512 VNNI or AVX-VNNI)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


def pack(q: Tensor, scale: Tensor) -> object:
    """fbgemm's packed form of the int8 matrix Q (N, K) with one scale per output row, without a bias."""
    zero = torch.zeros(q.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # quantized tensors are deprecated in torch 2.13, still the kernel's input
        warnings.simplefilter("ignore", UserWarning)
        weight = torch._make_per_channel_quantized_tensor(q.cpu(), scale.detach().double().cpu(), zero, 0)
        return torch.ops.quantized.linear_prepack(weight, None)


TINY = 1e-30  # a_r of a row of zeros: any positive number keeps it zero


@functools.lru_cache(maxsize=16)
def _guard(n_in: int) -> Tensor:
    """The guard row (1, -1, 0, ...): (1, K), fixing the quantization range to [-1, 1]. Read-only, shared."""
    guard = torch.zeros(1, n_in)
    guard[0, 0], guard[0, -1] = 1.0, -1.0
    return guard


def dynamic_int8_linear(x: Tensor, packed: object, bias: Tensor | None) -> Tensor:
    """y = x W^T + b with x quantized per row to 8 bits and W the packed int8 matrix: (..., K) -> (..., N)."""
    shape, n_in = x.shape, x.shape[-1]
    rows = x.reshape(-1, n_in).float()  # (M, K)
    size = rows.abs().amax(dim=1, keepdim=True).clamp_min_(TINY)  # (M, 1): a_r (a row of zeros stays zeros)
    unit = torch.cat([rows / size, _guard(n_in)])  # (M + 1, K)
    y = torch.ops.quantized.linear_dynamic(unit, packed, not has_vnni())[:-1]  # (M, N)
    y = y * size if bias is None else torch.addcmul(bias.float(), y, size)
    return y.to(x.dtype).reshape(*shape[:-1], y.shape[-1])


def reference(x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None) -> Tensor:
    """The formula of the module docstring step by step (8-bit inputs, as with VNNI), the sums in float64:
    what :func:`dynamic_int8_linear` computes. (..., K) -> (..., N)."""
    rows = x.reshape(-1, x.shape[-1]).double()
    size = rows.abs().amax(dim=1, keepdim=True)
    size = torch.where(size > 0, size, torch.ones_like(size))
    step = torch.tensor(2.0 / 255, dtype=torch.float32)  # fbgemm's float32 t, and x' times its float32 1 / t:
    inverse = 1.0 / step  # just below 127.5, so x' = 1 gives level 254 and x' = -1 level 0
    levels = torch.clamp(torch.round((rows / size).float() * inverse) + 127, 0, 255).double()  # X_rj
    y = (levels - 127) @ q.double().T * (float(step) * scale.double()) * size
    y = y if bias is None else y + bias.double()
    return y.reshape(*x.shape[:-1], q.shape[0])
