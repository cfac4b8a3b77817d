"""Fixtures of the decoding tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from qkv.decoding import fast_step as engine_module


@pytest.fixture
def quick_compile(monkeypatch) -> Iterator[dict]:
    """torch.compile through AOT autograd without inductor's code generation (seconds instead of minutes on
    this machine; the graph, its breaks and its recompiles are Dynamo's either way). Yields Dynamo's counters."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    monkeypatch.setattr(engine_module, "COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()
