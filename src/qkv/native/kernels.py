"""Calling the C library's training kernels from Python: the build condition they share, and one way to call them.

The kernels (``qkv_causal_attention``, ``qkv_swiglu``, ``qkv_rms_norm``, ``qkv_rotary``, ``qkv_cross_entropy`` and
their backward passes) take data pointers, int64 sizes and strides, and a thread count, and answer 0, or not 0
when they could not run (no scratch memory; a build without AVX-512 has no kernel and answers 1). Their wrappers
ask :func:`built` first (each in its ``applies``), so a failure after that is a RuntimeError naming the kernel,
which :func:`call` raises.
"""

from __future__ import annotations

import ctypes

from torch import Tensor

from qkv.native import library


def built() -> bool:
    """Whether the library was built with the kernels (AVX-512): without them PyTorch computes what they would."""
    lib = library()
    return lib is not None and bool(lib.qkv_prompt_attention_built())


def pointer(t: Tensor | None) -> ctypes.c_void_p:
    """A tensor's data pointer for C (NULL for None); the caller keeps the tensor alive during the call."""
    return ctypes.c_void_p(None if t is None else t.data_ptr())


def strides(*tensors: Tensor) -> list:
    """Each 4-D tensor's first three strides (its last is 1) as a C array of int64."""
    return [(ctypes.c_int64 * 3)(*t.stride()[:3]) for t in tensors]


def call(name: str, what: str, *arguments: object) -> None:
    """Call the library's function ``name``; RuntimeError naming ``what`` if it answers that it failed."""
    lib = library()
    assert lib is not None  # the caller's applies() asked built()
    if getattr(lib, name)(*arguments):
        raise RuntimeError(f"the C library's {what} failed")
