"""Keep the memory a CPU training step frees for the next step, instead of handing it back to the system and faulting
it in again.

glibc's malloc serves a request above its mmap threshold (128 KB at first, rising with what is freed, at most 32 MiB)
with fresh pages from the system and unmaps them when the tensor is freed, and it gives the free top of its heap back
once that exceeds the trim threshold. A training step allocates and frees the same tensors every step (a layer's
activations of a few MB, the loss's 33 MB chunks of logits), so every step touches new pages again: each is a trip
into the kernel, which zeroes it. :func:`keep_freed_memory` turns both off (``mallopt``: no mmap for allocations, a
trim threshold of 2 GB), so that after the first steps a step faults no page in; the high-water mark of the memory in
use stays what it was (the same tensors, reused). The memory is not given back before the process ends, which suits a
training process. ``QKV_KEEP_FREED_MEMORY=0`` leaves malloc as it is; other C libraries than glibc are left alone.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h
TRIM_THRESHOLD = (1 << 31) - 1  # bytes of free heap top kept (mallopt takes an int)

_done: list[bool] = []


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed memory in this process (see the module docstring); True if it did (now or
    before). Once per process: later calls only answer."""
    if _done:
        return _done[0]
    kept = False
    if os.environ.get("QKV_KEEP_FREED_MEMORY", "1") != "0" and platform.libc_ver()[0] == "glibc":
        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError):
            mallopt = None
        if mallopt is not None:
            mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
            kept = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    _done.append(kept)
    return kept
