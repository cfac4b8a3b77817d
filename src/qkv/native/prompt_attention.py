"""Causal attention of a prompt in the C library (``prompt_attention.h`` beside this file): the numbers of
``F.scaled_dot_product_attention`` up to float32 rounding (docs/generation.md has what it saves a prefill).

softmax(scale q k_j) v over the keys j that query i, at position Tk - Tq + i, may see (causal, optionally within a
sliding window), one tile of 8 queries at a time with FlashAttention's running maximum and sum. It takes what
inference hands it: float32 CPU tensors (B, h, Tq, d) and (B, h_kv, Tk, d) with contiguous rows (any other strides:
the heads split from a projection, or a KV cache's pool), d a multiple of 16 up to 256, no dropout, no gradient, no
mask other than the causal one; :func:`applies` says whether these are such, and the caller keeps PyTorch otherwise.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from qkv.native import library

# Fewer queries (a decoding step's, a few drafted tokens) stay with PyTorch: the kernel transposes every key first,
# which a few queries over many cached keys do not repay (16 over 512: 233 us against PyTorch's 196; 32: 342 / 369).
MIN_QUERIES = 32
LANES = 16  # floats of one AVX-512 vector: d is a whole number of them


def applies(queries: Tensor, keys: Tensor, values: Tensor, *, dropout_p: float = 0.0) -> bool:
    """Whether the C kernel takes these tensors (see the module's docstring for what it takes)."""
    tensors = (queries, keys, values)
    return (
        all(t.dim() == 4 and t.dtype == torch.float32 and t.device.type == "cpu" and t.stride(-1) == 1 for t in tensors)
        and queries.shape[-2] >= MIN_QUERIES
        and queries.shape[-2] <= keys.shape[-2] == values.shape[-2]
        and queries.shape[-1] % LANES == 0
        and queries.shape[-1] <= 256
        and queries.shape[-1] == keys.shape[-1] == values.shape[-1]
        and queries.shape[1] % keys.shape[1] == 0
        and keys.shape[1] == values.shape[1]
        and queries.shape[0] == keys.shape[0] == values.shape[0]
        and dropout_p == 0.0
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
        and not torch.compiler.is_compiling()
        and library() is not None
    )


def causal_attention(
    queries: Tensor, keys: Tensor, values: Tensor, *, window: int | None = None, scale: float | None = None
) -> Tensor | None:
    """The attention (B, h, Tq, d) of queries at the last Tq of Tk positions (``window``: each sees its last
    ``window`` keys only), or None where the library cannot (no AVX-512): then the caller computes it."""
    lib = library()
    assert lib is not None  # applies() checked it
    batch, heads, n_queries, d = queries.shape
    out = torch.empty(batch, n_queries, heads, d).transpose(1, 2)  # the layout merge_heads reads without a copy
    strides = [(ctypes.c_int64 * 3)(*t.stride()[:3]) for t in (queries, keys, values, out)]
    failed = lib.qkv_causal_attention(
        ctypes.c_void_p(queries.data_ptr()), strides[0], ctypes.c_void_p(keys.data_ptr()), strides[1],
        ctypes.c_void_p(values.data_ptr()), strides[2], ctypes.c_void_p(out.data_ptr()), strides[3],
        ctypes.c_int64(batch), ctypes.c_int64(heads), ctypes.c_int64(keys.shape[1]), ctypes.c_int64(n_queries),
        ctypes.c_int64(keys.shape[2]), ctypes.c_int64(d), ctypes.c_int64(window or 0),
        ctypes.c_float(d**-0.5 if scale is None else scale), ctypes.c_int32(torch.get_num_threads()),
    )  # fmt: skip
    return None if failed else out


def built() -> bool:
    """Whether the C library has the kernel (it needs AVX-512; without it :func:`causal_attention` answers None)."""
    lib = library()
    return lib is not None and bool(lib.qkv_prompt_attention_built())
