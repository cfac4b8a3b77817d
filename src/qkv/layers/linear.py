"""Linear layers, y = x W^T + b, with a faster path for decoding a few tokens at a time on a CPU.

Every projection in the Transformer (W_q, W_k, W_v, W_o, the FFN's W_1 and W_2, the unembedding W_U) is
one. In training, x holds thousands of token vectors and the product is arithmetic-bound. When decoding,
x holds one vector per sequence: each product reads the whole matrix to do two FLOPs per weight, so its
speed is how fast the matrix streams from memory. Written as a batched matmul over the matrix's rows cut
into one block per thread, every core reads at once (the measurements behind this choice are in
docs/generation.md, "Matrix-vector products on the CPU").

:func:`linear` takes the batched path on the CPU, without gradients, for at most :data:`FEW_ROWS` input
vectors and a matrix of at least :data:`LARGE_MATRIX` weights. Inside :func:`onednn_rows` (the decoding
engine's steps), 2 to :data:`FEW_ROWS` float32 vectors (a decoding batch) go to oneDNN's linear on the plain
matrix instead (``torch.ops.mkldnn._linear_pointwise``), which blocks the product for a few rows better
than MKL's GEMM or the batched path (measured in docs/generation.md).
Each output is the same dot product either way; only the rounding of the sum may differ.
``bench/pretrained.py`` measures the effect on whole-model generation against Hugging Face ``transformers``
and CTranslate2.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

FEW_ROWS = 16  # input vectors (tokens x sequences); beyond this the product is arithmetic-bound
LARGE_MATRIX = 1 << 18  # 1 MB of float32: smaller matrices stay in cache and gain nothing


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``: (..., d_in) -> (..., d_out), memory-parallel for a few vectors."""
    if torch.compiler.is_compiling():  # a compiled graph picks its own kernels (and get_num_threads breaks it)
        return F.linear(x, weight, bias)
    blocks = torch.get_num_threads()
    n_out, n_in = weight.shape
    rows = x.numel() // n_in if n_in else 0
    if (
        blocks < 2
        or not 0 < rows <= FEW_ROWS
        or weight.numel() < LARGE_MATRIX
        or torch.is_grad_enabled()
        or x.device.type != "cpu"
        or not weight.is_contiguous()
    ):
        return F.linear(x, weight, bias)
    if rows > 1 and getattr(_state, "onednn", False) and x.dtype == weight.dtype == torch.float32 and _onednn_linear():
        out = torch.ops.mkldnn._linear_pointwise(x.reshape(rows, n_in), weight, bias, "none", [], "")
        return out.view(*x.shape[:-1], n_out)  # (rows, n_out) -> (..., n_out)
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
    """Whether torch has oneDNN's CPU linear (``torch.ops.mkldnn._linear_pointwise``)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _blocks_product(stacked: Tensor, vectors: Tensor, bias: Tensor | None, out: Tensor | None = None) -> Tensor:
    """W_block x (+ b_block) for every row block at once: (blocks, per_block, rows)."""
    if bias is None:
        return torch.bmm(stacked, vectors, out=out)
    return torch.baddbmm(bias, stacked, vectors, out=out)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state-dict names) whose forward is :func:`linear`."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)
