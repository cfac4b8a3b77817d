"""The C library's ``forward.h`` from Python: what the quantized layers' PyTorch forward hands to C on a prompt.

Each function gives PyTorch's own numbers bit for bit (the tests compare), in one pass where PyTorch takes several
elementwise operations:

- :func:`round_blocks`: x rounded to int8 in blocks of 32 and back (the int8-activation layers, W8A8 and W4A8);
- :func:`round_blocks_twice`: that, plus what it missed rounded alike (activations "int8x2");
- :func:`widen_int4`: a 4-bit matrix as W = s q + m, float32 or bfloat16;
- :func:`widen_int8`: a grouped int8 matrix as W = s q, float32 or bfloat16.

:func:`available` is what every caller asks first (with its own conditions on shapes and dtypes): CPU tensors,
outside torch.compile, and a built library (:mod:`qkv.native`).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from qkv import native


def available(*tensors: Tensor) -> bool:
    """Whether the C library can take these tensors: all on the CPU, outside torch.compile, the library built."""
    return (
        all(t.device.type == "cpu" for t in tensors)
        and not torch.compiler.is_compiling()
        and native.library() is not None
    )


def _library() -> ctypes.CDLL:
    library = native.library()
    assert library is not None  # available() checked it
    return library


def _pointer(tensor: Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(tensor.data_ptr())


def _threads() -> ctypes.c_int32:
    return ctypes.c_int32(torch.get_num_threads())


def round_blocks(x: Tensor) -> Tensor:
    """x (..., K) float32 contiguous, K a multiple of 32, each block of 32 rounded to int8 levels times its scale."""
    out = torch.empty_like(x)
    rows, k = ctypes.c_int64(x.numel() // x.shape[-1]), ctypes.c_int64(x.shape[-1])
    _library().qkv_round_blocks(_pointer(x), rows, k, _pointer(out), _threads())
    return out


def round_blocks_twice(x: Tensor) -> Tensor:
    """:func:`round_blocks`, then what that missed rounded alike and added (activations "int8x2"), in one pass."""
    out = torch.empty_like(x)
    rows, k = ctypes.c_int64(x.numel() // x.shape[-1]), ctypes.c_int64(x.shape[-1])
    _library().qkv_round_blocks_twice(_pointer(x), rows, k, _pointer(out), _threads())
    return out


def widen_int4(qweight: Tensor, scale: Tensor, minimum: Tensor, dtype: torch.dtype) -> Tensor:
    """s Q + m (N, K) in ``dtype`` (float32 or bfloat16) of packed levels (N, K / 2) uint8 and float16 s, m."""
    qweight, scale, minimum = qweight.contiguous(), scale.contiguous(), minimum.contiguous()
    rows, k = qweight.shape[0], qweight.shape[1] * 2
    out = torch.empty(rows, k, dtype=dtype)
    sizes = ctypes.c_int64(rows), ctypes.c_int64(k), ctypes.c_int64(k // scale.shape[1])
    _library().qkv_dequantize_int4(_pointer(qweight), _pointer(scale), _pointer(minimum), *sizes, _pointer(out),
                                   ctypes.c_int32(dtype == torch.bfloat16), _threads())  # fmt: skip
    return out


def widen_int8(q: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """s Q (N, K) in ``dtype`` (float32 or bfloat16) of int8 Q (N, K) with float32 scales per group (N, K / g)."""
    q, scale = q.contiguous(), scale.contiguous()
    out = torch.empty(q.shape, dtype=dtype)
    sizes = ctypes.c_int64(q.shape[0]), ctypes.c_int64(q.shape[1]), ctypes.c_int64(q.shape[1] // scale.shape[1])
    _library().qkv_dequantize_int8(_pointer(q), _pointer(scale), *sizes, _pointer(out),
                                   ctypes.c_int32(dtype == torch.bfloat16), _threads())  # fmt: skip
    return out
