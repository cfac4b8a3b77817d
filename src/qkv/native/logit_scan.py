"""One read of a step's logits in C (``logit_scan.h`` beside this file): whether they are all finite, and each row's
argmax (greedy decoding's next token), where PyTorch takes two passes, the slower of them ``argmax`` (timings:
docs/generation.md, "A decode step in one call"). Each row is read once with 16-lane vectors.

:func:`applies` says whether the library takes the logits: a float32 CPU tensor of contiguous rows (B, V), outside
torch.compile, with the library built for AVX-512 (as the training kernels: :func:`~qkv.native.kernels.built`).
The argmax is torch.argmax's, ties included (the first largest value).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from qkv.native import library
from qkv.native.kernels import built, pointer

MAX_COLUMNS = 1 << 31  # the scan keeps column numbers in 32-bit lanes


def applies(logits: Tensor) -> bool:
    """Whether :func:`scan` reads ``logits`` in C."""
    return (
        logits.dtype == torch.float32
        and logits.device.type == "cpu"
        and logits.dim() == 2
        and 0 < logits.shape[1] < MAX_COLUMNS
        and logits.is_contiguous()
        and not torch.compiler.is_compiling()
        and built()
    )


def scan(logits: Tensor, argmax: bool = True) -> tuple[bool, Tensor | None]:
    """(whether every logit is finite, each row's argmax as a (B,) long tensor or None) for ``logits`` (B, V) that
    :func:`applies` takes. The argmax of a row holding NaN is meaningless: ask whether they are finite first."""
    rows = logits.shape[0]
    ids = torch.empty(rows, dtype=torch.long)  # -1 for a row with NaN or inf
    lib = library()
    assert lib is not None  # applies() asked built()
    bad = lib.qkv_scan_logits(
        pointer(logits), ctypes.c_int64(rows), ctypes.c_int64(logits.shape[1]), pointer(ids),
        ctypes.c_int32(torch.get_num_threads()),
    )  # fmt: skip
    return not bad, ids if argmax else None
