"""qkv.native.kernels: the one way the training kernels' wrappers call the C library."""

from __future__ import annotations

import ctypes

import pytest
import torch

from qkv import native
from qkv.native import kernels


class Library:
    """A stand-in for the loaded library: each function answers what it was given."""

    def __init__(self, answer: int, built: int = 1) -> None:
        self.answer, self.built, self.calls = answer, built, []

    def qkv_prompt_attention_built(self) -> int:
        return self.built

    def qkv_something(self, *arguments: object) -> int:
        self.calls.append(arguments)
        return self.answer


def test_a_call_that_answers_0_passes_its_arguments(monkeypatch) -> None:
    lib = Library(0)
    monkeypatch.setattr(kernels, "library", lambda: lib)
    kernels.call("qkv_something", "something", 1, 2)
    assert lib.calls == [(1, 2)]


def test_a_call_that_fails_is_a_runtime_error_naming_the_kernel(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "library", lambda: Library(1))
    with pytest.raises(RuntimeError, match="the C library's RMSNorm backward pass failed"):
        kernels.call("qkv_something", "RMSNorm backward pass")


def test_built_needs_a_library_with_the_kernels(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "library", lambda: None)
    assert not kernels.built()
    monkeypatch.setattr(kernels, "library", lambda: Library(0, built=0))
    assert not kernels.built()
    monkeypatch.setattr(kernels, "library", lambda: Library(0, built=1))
    assert kernels.built()


def test_pointers_and_strides() -> None:
    x = torch.zeros(2, 3, 4, 5).transpose(1, 2)
    assert kernels.pointer(None).value is None and kernels.pointer(x).value == x.data_ptr()
    (row,) = kernels.strides(x)
    assert isinstance(row, ctypes.Array) and list(row) == list(x.stride()[:3])


@pytest.mark.skipif(native.library() is None, reason="no C compiler: the library is not built")
def test_the_real_library_answers_whether_it_has_the_kernels() -> None:
    assert kernels.built() == bool(native.library().qkv_prompt_attention_built())
