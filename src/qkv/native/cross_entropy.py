"""The cross-entropy of a chunk of logits and its gradient, softmax - one-hot, in the C library (``cross_entropy.h``
beside this file): each row read from memory once and its gradient written over it, where PyTorch's operators cross
the chunk seven times. :mod:`qkv.layers.linear_cross_entropy` hands it each chunk of a training step's logits.

:func:`applies` says whether the library takes the logits: a float32 CPU matrix (rows, V), contiguous, V >= 1,
outside torch.compile, with the library built for AVX-512. The numbers are PyTorch's up to float32 rounding (the
exponentials within 3 units in the last place).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from qkv.native.kernels import built, call, pointer


def applies(logits: Tensor) -> bool:
    """Whether :func:`cross_entropy_` takes ``logits``."""
    return (
        logits.dim() == 2
        and logits.shape[1] > 0
        and logits.dtype == torch.float32
        and logits.device.type == "cpu"
        and logits.is_contiguous()
        and not torch.compiler.is_compiling()
        and built()
    )


def cross_entropy_(logits: Tensor, targets: Tensor, keep: Tensor, *, gradient: bool) -> Tensor:
    """Each row's keep (logsumexp(z) - z[t]) (rows,); with ``gradient``, keep (softmax(z) - onehot(t)) is written over
    ``logits``. ``targets``: (rows,) indices in [0, V); ``keep``: (rows,) booleans, the rows that count."""
    rows, vocabulary = logits.shape
    targets = targets.to(torch.int64).contiguous()
    if rows and not 0 <= int(targets.min()) <= int(targets.max()) < vocabulary:  # the C code would read elsewhere
        raise IndexError(f"a target is outside the vocabulary of {vocabulary} tokens")
    keep = keep.to(torch.uint8).contiguous()
    losses = torch.empty(rows)
    call(
        "qkv_cross_entropy", "cross-entropy", pointer(logits), pointer(targets), pointer(keep), pointer(losses),
        ctypes.c_int64(rows), ctypes.c_int64(vocabulary), ctypes.c_int32(int(gradient)),
        ctypes.c_int32(torch.get_num_threads()),
    )  # fmt: skip
    return losses
