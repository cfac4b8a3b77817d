"""Linear layers, y = x W^T + b, with a faster path for decoding a few tokens at a time on a CPU.

Every projection in the Transformer (W_q, W_k, W_v, W_o, the FFN's W_1 and W_2, the unembedding W_U) is
one. In training, x holds thousands of token vectors and the product is arithmetic-bound. When decoding,
x holds one vector per sequence: each product reads the whole matrix to do two FLOPs per weight, so its
speed is how fast the matrix streams from memory. Written as a batched matmul over the matrix's rows cut
into one block per thread, every core reads at once (the measurements behind this choice are in
docs/generation.md, "Matrix-vector products on the CPU").

:func:`linear` takes the batched path on the CPU, without gradients, for at most :data:`FEW_ROWS` input vectors
and a matrix of at least :data:`LARGE_MATRIX` weights, except one vector where torch's products are MKL's on an
Intel CPU: there MKL's own matrix-vector kernel reads with every thread, faster still. Inside :func:`onednn_rows`
(the decoding engine's steps, the server's batch), 2 to :data:`BATCH_ROWS` float32 vectors (a decoding batch,
beams included) go to oneDNN's linear instead (``torch.ops.mkldnn._linear_pointwise``), on a copy of the matrix
reordered once into oneDNN's blocked layout (:func:`packed_weight`), which multiplies a few rows faster than the
plain matrix, MKL's GEMM or the batched path, and up to a few hundred rows faster than MKL's GEMM (measured in
docs/generation.md, "Products of a few rows"). The copy is made on first use and kept while the weight lives and
is not changed in place: the float32 bytes of the matrices a batch multiplies, once more
(:func:`use_packed_weights` turns the copies off). Two rows go through as four (two of zeros), which oneDNN
blocks better. Each output is the same dot product either way; only the rounding of the sum may differ.
``bench/pretrained.py`` measures the effect on whole-model generation against Hugging Face ``transformers`` and
CTranslate2.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

FEW_ROWS = 16  # input vectors (tokens x sequences); beyond this the product is arithmetic-bound
BATCH_ROWS = 256  # inside onednn_rows(): oneDNN's packed product beats MKL's GEMM up to here
LARGE_MATRIX = 1 << 18  # 1 MB of float32: smaller matrices stay in cache and gain nothing


def _mkl_on_intel() -> bool:
    """Whether torch's products are MKL's on an Intel CPU, where its matrix-vector kernel streams a matrix with every
    thread (2.2-2.6x the batched path's speed on a 2-core Emerald Rapids, docs/generation.md). On other CPUs MKL
    takes generic code paths, and one vector goes through the batched path."""
    if not torch.backends.mkl.is_available():
        return False
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("vendor_id") and "GenuineIntel" in line for line in f)
    except OSError:
        return False


MKL_ON_INTEL = _mkl_on_intel()  # read once: a constant of a compiled graph


def _threads() -> int:
    """torch's thread count; a constant of a compiled graph (read when the graph is made)."""
    return torch.get_num_threads()


# torch.compiler.assume_constant_result(_threads), which only sets this mark, without importing Dynamo at qkv's
# import (the decorator imports it: 2-4 s added to every command; tests/layers/test_linear.py checks the mark)
_threads._dynamo_marked_constant = True  # type: ignore[attr-defined]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``: (..., d_in) -> (..., d_out), memory-parallel for a few vectors.

    Under ``torch.compile`` a few vectors keep the batched product (Inductor's own choice for them, MKL's GEMM,
    reads the matrix at about half the speed), with the thread count fixed when the graph is made; oneDNN's
    packed products are left out (their copies live outside the graph)."""
    compiling = torch.compiler.is_compiling()
    if not compiling and frozen_product_applies(x, weight):  # training above a frozen matrix (LoRA's base)
        return FrozenProduct.apply(x, weight, bias)
    blocks = _threads()
    n_out, n_in = weight.shape
    rows = x.numel() // n_in if n_in else 0
    if (
        not 0 < rows <= BATCH_ROWS
        or weight.numel() < LARGE_MATRIX
        or torch.is_grad_enabled()
        or x.device.type != "cpu"
        or not weight.is_contiguous()
    ):
        return F.linear(x, weight, bias)
    onednn = not compiling and getattr(_state, "onednn", False)
    if rows > 1 and onednn and x.dtype == weight.dtype == torch.float32 and _onednn_linear():
        x2 = x.reshape(rows, n_in)
        if rows == 2:
            x2 = F.pad(x2, (0, 0, 0, 2))  # (4, n_in): oneDNN's kernel for two rows is slower than for four
        matrix = packed_weight(weight) if _packing_on else weight
        out = torch.ops.mkldnn._linear_pointwise(x2, matrix, bias, "none", [], "")[:rows]
        return out.view(*x.shape[:-1], n_out)  # (rows, n_out) -> (..., n_out)
    if blocks < 2 or rows > FEW_ROWS or (rows == 1 and MKL_ON_INTEL):
        return F.linear(x, weight, bias)
    per_block = n_out // blocks
    split = blocks * per_block  # rows of W in the blocks; the n_out % blocks left over go through one mm
    x2 = x.reshape(rows, n_in)
    vectors = x2.T.expand(blocks, n_in, rows)  # the same x for every block, no copy
    stacked = (weight if split == n_out else weight[:split]).view(blocks, per_block, n_in)
    block_bias = None if bias is None else (bias if split == n_out else bias[:split]).view(blocks, per_block, 1)
    if split == n_out:
        out = _blocks_product(stacked, vectors, block_bias)  # (blocks, per_block, rows)
        if rows > 1:
            out = out.permute(2, 0, 1)  # (rows, blocks, per_block): the blocks side by side for each vector
        return out.reshape(*x.shape[:-1], n_out)
    # Rows left over (GPT-2's 50257 outputs): each part is written into its place, no concatenation.
    out = x.new_empty(rows, n_out)
    if rows == 1:  # the blocks' output is already in place: (blocks, per_block, 1) is (1, split)
        _blocks_product(stacked, vectors, block_bias, out=out[:, :split].view(blocks, per_block, 1))
    else:
        product = _blocks_product(stacked, vectors, block_bias)  # (blocks, per_block, rows)
        out[:, :split].view(rows, blocks, per_block).copy_(product.permute(2, 0, 1))
    rest, tail = out[:, split:], weight[split:].T  # (rows, n_out - split), (n_in, n_out - split)
    if bias is None:
        torch.mm(x2, tail, out=rest)
    else:
        torch.addmm(bias[split:], x2, tail, out=rest)
    return out.view(*x.shape[:-1], n_out)


_state = threading.local()  # .onednn: inside onednn_rows() on this thread
_state.onednn = False


@contextlib.contextmanager
def onednn_rows() -> Iterator[None]:
    """Within this block (on this thread), :func:`linear` multiplies 2 to FEW_ROWS vectors with oneDNN."""
    before = getattr(_state, "onednn", False)
    _state.onednn = True
    try:
        yield
    finally:
        _state.onednn = before


@functools.cache
def _onednn_linear() -> bool:
    """Whether torch has oneDNN's CPU linear and its weight reorder (``torch.ops.mkldnn``)."""
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_linear_pointwise")
        and hasattr(ops, "_reorder_linear_weight")
    )


PACK_ROWS = 64  # the batch size oneDNN is told to expect when it lays the matrix out (best for 4-16 rows)
_packing_on = True  # use_packed_weights() turns the copies off
_packed: dict[tuple[int, str], tuple[weakref.ref, tuple[int, int], Tensor]] = {}  # (id, kind) -> (weight, stamp, copy)
_packing = threading.Lock()


def use_packed_weights(enabled: bool) -> None:
    """Whether batches multiply packed copies of the weights (the default) or the plain matrices: one copy
    of the weights in memory, slower batches (``qkv serve --no-packed-weights``). Turning them off frees the
    copies made so far."""
    global _packing_on
    _packing_on = bool(enabled)
    if not enabled:
        with _packing:
            _packed.clear()


def packed_weight(weight: Tensor) -> Tensor:
    """``weight`` (n_out, n_in) reordered into oneDNN's blocked layout for ``_linear_pointwise``; made once
    per weight and made again when the weight has changed: in place (a training step) or given new storage
    (``param.data = ...``, as ``module.float()`` does)."""
    return _cached_copy(weight, "packed", lambda w: torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS))


def packed_transpose(weight: Tensor) -> Tensor:
    """W^T (n_in, n_out) in oneDNN's blocked layout, made once per weight as :func:`packed_weight` is: what the
    backward pass of a frozen W multiplies by, dL/dx = dL/dy W = linear(dL/dy, W^T). The plain matrix, whose rows
    MKL's GEMM reads across for this product, was 14-23% slower for a training batch's rows (docs/training.md)."""
    return _cached_copy(
        weight, "packed-transpose", lambda w: torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous(), PACK_ROWS)
    )


def bfloat16_weight(weight: Tensor) -> Tensor:
    """A bfloat16 copy of a frozen float32 ``weight``, kept as :func:`packed_weight` keeps its copies: what
    bfloat16 autocast multiplies by, without casting the matrix again at every product."""
    return _cached_copy(weight, "bfloat16", lambda w: w.to(torch.bfloat16))


def _cached_copy(weight: Tensor, kind: str, make) -> Tensor:  # noqa: ANN001
    key = (id(weight), kind)
    version = -1 if weight.is_inference() else weight._version  # inference tensors keep no version counter
    stamp = (version, weight.data_ptr())
    entry = _packed.get(key)
    if entry is not None and entry[0]() is weight and entry[1] == stamp:
        return entry[2]
    with _packing:
        copy = make(weight.detach())
        _packed[key] = (weakref.ref(weight, lambda _: _packed.pop(key, None)), stamp, copy)
    return copy


def autocast_bfloat16(x: Tensor) -> bool:
    """Whether bfloat16 autocast is on for x's device (the CPU's, or CUDA's)."""
    kind = x.device.type
    return torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) == torch.bfloat16


def _blocks_product(stacked: Tensor, vectors: Tensor, bias: Tensor | None, out: Tensor | None = None) -> Tensor:
    """W_block x (+ b_block) for every row block at once: (blocks, per_block, rows)."""
    if bias is None:
        return torch.bmm(stacked, vectors, out=out)
    return torch.baddbmm(bias, stacked, vectors, out=out)


def packs(weight: Tensor) -> bool:
    """Whether ``weight`` is a frozen, contiguous float32 CPU matrix that oneDNN can multiply by from a packed copy."""
    return not weight.requires_grad and packable(weight)


def packable(weight: Tensor) -> bool:
    """Whether ``weight`` is a contiguous float32 CPU matrix that oneDNN can reorder (frozen or not)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.is_contiguous()
        and _packing_on
        and _onednn_linear()
    )


def packed_now(weight: Tensor) -> Tensor:
    """A packed copy of ``weight`` (:func:`packed_weight`'s layout) made now and not kept: for a matrix that changes
    every step but multiplies several batches of rows within one (a trained W_U's chunks in the loss)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)


def packed_copy_product(x: Tensor, packed: Tensor, n_out: int, bias: Tensor | None = None) -> Tensor:
    """x W^T + b from a packed copy of W (:func:`packed_now`), no gradient: (..., K) -> (..., n_out)."""
    rows = x.detach().reshape(-1, x.shape[-1]).contiguous()
    out = torch.ops.mkldnn._linear_pointwise(rows, packed, None if bias is None else bias.detach(), "none", [], "")
    return out if x.dim() == 2 else out.view(*x.shape[:-1], n_out)  # not a view: an autograd output may change in place


def frozen_product_applies(x: Tensor, weight: Tensor) -> bool:
    """Whether ``linear`` multiplies rows that take a gradient by a frozen matrix it :func:`packs`
    (:class:`FrozenProduct`): LoRA's base while fine-tuning, in float32 or under bfloat16 autocast."""
    wide = x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and autocast_bfloat16(x))
    return torch.is_grad_enabled() and x.requires_grad and wide and packs(weight)


def packed_product(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x W^T + b through oneDNN on the packed copy of W (:func:`packed_weight`), no gradient: (..., K) -> (..., N)."""
    return packed_copy_product(x, packed_weight(weight), weight.shape[0], bias)


def packed_transposed_product(grad: Tensor, weight: Tensor) -> Tensor:
    """grad W through oneDNN on the packed copy of W^T (:func:`packed_transpose`), no gradient: (..., N) -> (..., K)."""
    return packed_copy_product(grad, packed_transpose(weight), weight.shape[1])


class FrozenProduct(torch.autograd.Function):
    """x W^T + b for a frozen W, differentiable in x: the forward on oneDNN's packed copy of W (:func:`packed_weight`,
    the one decoding uses; 10-40% faster than the plain matrix for a training batch's rows on the CPUs measured in
    docs/training.md), the backward dL/dx = dL/dy W on a packed copy of W^T (:func:`packed_transpose`). Under
    bfloat16 autocast both products multiply in bfloat16, as autocast's own linear does, by a copy of W made once
    (:func:`bfloat16_weight`) where autocast would cast W at every product; the output is bfloat16, as autocast's."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # noqa: ANN001
        ctx.bias_grad = bias is not None and bias.requires_grad
        ctx.dtypes = x.dtype, None if bias is None else bias.dtype
        if autocast_bfloat16(x):
            low = bfloat16_weight(weight)
            ctx.save_for_backward(low)
            return F.linear(x.to(low.dtype), low, None if bias is None else bias.to(low.dtype))
        ctx.save_for_backward(weight)
        return packed_product(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, Tensor | None]:  # noqa: ANN001
        (weight,) = ctx.saved_tensors
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0).to(ctx.dtypes[1]) if ctx.bias_grad else None
        if weight.dtype == torch.float32 and grad.dtype == torch.float32:
            return packed_transposed_product(grad, weight), None, grad_bias  # (..., N) @ (N, K) -> (..., K)
        grad_x = (grad.to(weight.dtype) @ weight).to(ctx.dtypes[0])
        return grad_x, None, grad_bias


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state-dict names) whose forward is :func:`linear`."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)
