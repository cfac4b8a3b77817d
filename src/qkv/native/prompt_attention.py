"""Causal attention of a whole sequence in the C library (``prompt_attention.h`` beside this file, and
``attention_backward.h`` for its gradients): the numbers of ``F.scaled_dot_product_attention`` up to float32
rounding (docs/generation.md has what it saves a prefill, docs/training.md a training step).

softmax(scale q k_j) v over the keys j that query i, at position Tk - Tq + i, may see (causal, optionally within a
sliding window), one tile of 8 queries at a time with FlashAttention's running maximum and sum. It takes float32 CPU
tensors (B, h, Tq, d) and (B, h_kv, Tk, d) with contiguous rows (any other strides: the heads split from a
projection, or a KV cache's pool), d a multiple of 16 up to 256, no dropout, no mask other than the causal one;
:func:`applies` says whether these are such, and the caller keeps PyTorch otherwise. Where a gradient is wanted
(training), :class:`CausalAttention` keeps each query's log-sum-exp from the forward pass, and the backward pass
recomputes the weights from it, FlashAttention-2's way, without storing them.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from qkv.native import library
from qkv.native.kernels import built, call, pointer, strides

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
        and not torch.compiler.is_compiling()
        and library() is not None
    )


def causal_attention(
    queries: Tensor, keys: Tensor, values: Tensor, *, window: int | None = None, scale: float | None = None
) -> Tensor | None:
    """The attention (B, h, Tq, d) of queries at the last Tq of Tk positions (``window``: each sees its last
    ``window`` keys only), or None where the library cannot (no AVX-512): then the caller computes it. Differentiable
    in all three inputs where a gradient is wanted."""
    scale = queries.shape[-1] ** -0.5 if scale is None else scale
    if torch.is_grad_enabled() and any(t.requires_grad for t in (queries, keys, values)):
        if not built():
            return None
        return CausalAttention.apply(queries, keys, values, window or 0, scale)
    return _forward(queries, keys, values, window or 0, scale, None)


def _sizes(queries: Tensor, keys: Tensor, window: int, scale: float) -> list:
    """The C functions' trailing arguments: batch, h, h_kv, Tq, Tk, d, window, scale, threads."""
    batch, heads, n_queries, d = queries.shape
    return [
        ctypes.c_int64(batch), ctypes.c_int64(heads), ctypes.c_int64(keys.shape[1]), ctypes.c_int64(n_queries),
        ctypes.c_int64(keys.shape[2]), ctypes.c_int64(d), ctypes.c_int64(window), ctypes.c_float(scale),
        ctypes.c_int32(torch.get_num_threads()),
    ]  # fmt: skip


def _forward(
    queries: Tensor, keys: Tensor, values: Tensor, window: int, scale: float, lse: Tensor | None
) -> Tensor | None:
    lib = library()
    assert lib is not None  # applies() checked it
    batch, heads, n_queries, d = queries.shape
    out = torch.empty(batch, n_queries, heads, d).transpose(1, 2)  # the layout merge_heads reads without a copy
    s = strides(queries, keys, values, out)
    failed = lib.qkv_causal_attention(
        pointer(queries), s[0], pointer(keys), s[1], pointer(values), s[2], pointer(out),
        s[3], pointer(lse), *_sizes(queries, keys, window, scale),
    )  # fmt: skip
    return None if failed else out


class CausalAttention(torch.autograd.Function):
    """:func:`causal_attention` with its gradients (``attention_backward.h``): the forward pass keeps q, k, v, the
    output and each query's log-sum-exp; the backward pass computes dQ, dK and dV from them in one C call."""

    @staticmethod
    def forward(ctx, queries, keys, values, window, scale):  # noqa: ANN001, ANN205
        batch, heads, n_queries, _ = queries.shape
        lse = torch.empty(batch, heads, n_queries)
        out = _forward(queries.detach(), keys.detach(), values.detach(), window, scale, lse)
        if out is None:
            raise RuntimeError("the C attention kernel failed")  # built() was checked: only out of memory
        ctx.save_for_backward(queries, keys, values, out, lse)
        ctx.window, ctx.scale = window, scale
        return out

    @staticmethod
    @once_differentiable  # the C call is not itself differentiable: a second derivative is refused, not zero
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        queries, keys, values, out, lse = ctx.saved_tensors
        grad = grad if grad.stride(-1) == 1 else grad.contiguous()
        dq, dk, dv = torch.empty_like(queries), torch.empty_like(keys), torch.empty_like(values)
        s = strides(queries, keys, values, out, grad, dq, dk, dv)
        call(
            "qkv_causal_attention_backward", "attention backward pass",
            pointer(queries), s[0], pointer(keys), s[1], pointer(values), s[2], pointer(out), s[3], pointer(grad),
            s[4], pointer(lse), pointer(dq), s[5], pointer(dk), s[6], pointer(dv), s[7],
            *_sizes(queries, keys, ctx.window, ctx.scale),
        )  # fmt: skip
        return dq, dk, dv, None, None
