"""The C library's ``forward.h`` from Python: what the quantized layers' PyTorch forward hands to C on a prompt.

Each function gives PyTorch's own numbers bit for bit (the tests compare), in one pass where PyTorch takes several
elementwise operations:

- :func:`round_blocks`: x rounded to int8 in blocks of 32 and back (the int8-activation layers, W8A8 and W4A8);
- :func:`round_blocks_twice`: that, plus what it missed rounded alike (activations "int8x2");
- :func:`widen_int4`: a 4-bit matrix as W = s q + m, float32 or bfloat16;
- :func:`widen_int8`: a grouped int8 matrix as W = s q, float32 or bfloat16;

and :func:`lanes_product`, a prompt's product of an int4 layer with int8 activations (W4A8) by the decode step's own
product (its 16-row kernels: integer sums exact, the step's numbers), where PyTorch would widen the weights to float
for a GEMM.

:func:`available` is what every caller asks first (with its own conditions on shapes and dtypes): CPU tensors,
outside torch.compile, and a built library (:mod:`qkv.native`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

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


PROMPT_ROWS = 64  # rows of x above which lanes_product takes an int4 layer's product (below: PyTorch's int4 kernel)


def lanes_product(
    x: Tensor,
    weights: tuple[Tensor, Tensor, Tensor],
    bias: Tensor | None,
    group_size: int,
    lanes: Callable[[], tuple[Tensor, Tensor, Tensor]],
) -> Tensor | None:
    """x W^T + b for an int4 layer whose int8 activations are rounded once (the caller's to check), on more than
    :data:`PROMPT_ROWS` rows of x, by the C step's product (``qkv_int4_lanes_product``), or None where that does
    not run: fewer rows, x not float32 on the CPU, a gradient to keep, torch.compile, K not a multiple of 32, fewer
    than 16 rows of W, a bias not float32, or no 16-row kernel for this CPU (AVX2, or AVX-512 with VNNI).
    ``weights``: Q (N, K / 2 bytes), s and m (N, K / group_size) float16; ``lanes()``: the layer's 16-row copy of
    them (:meth:`~qkv.quantization.int4_linear.Int4Linear.lanes`), asked for only where the product runs."""
    q4, s16, m16 = weights
    n, k = q4.shape[0], x.shape[-1]
    if x.dtype != torch.float32 or x.numel() <= PROMPT_ROWS * k or k % 32 or n < 16 or k != q4.shape[1] * 2:
        return None
    keep_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, q4, bias))
    if keep_grad or (bias is not None and bias.dtype != torch.float32) or s16.dtype != torch.float16:
        return None
    if not (available(x, q4) and _library().qkv_lane_kernels()):
        return None
    rows = x.reshape(-1, k).contiguous()
    y = torch.empty(rows.shape[0], n)
    tensors = (*(t.contiguous() for t in weights), None if bias is None else bias.detach().contiguous(), *lanes())
    pointers = [None if t is None else _pointer(t) for t in tensors]
    sizes = ctypes.c_int32(n), ctypes.c_int32(k), ctypes.c_int32(group_size)
    if _library().qkv_int4_lanes_product(*sizes, *pointers, ctypes.c_int32(rows.shape[0]), _pointer(rows),
                                         _pointer(y), _threads()):  # fmt: skip
        raise MemoryError("the int4 prompt product could not allocate its scratch memory")
    return y.reshape(*x.shape[:-1], n)
