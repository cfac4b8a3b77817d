"""Named activations: one light way to look inside a forward pass.

Every module that computes something a learner wants to see (queries, keys, values, attention scores and
weights, block outputs, logits) calls :func:`record` with a short name. Normally that does nothing. Inside
``with capture(model) as acts:`` each call stores a detached copy under the module's dotted name, so

    with capture(model) as acts:
        model(token_ids)
    acts["blocks.0.self_attn.weights"]      # (B, n_heads, T, T), rows sum to 1

gives the attention weights of the first block, computed by the model's own forward pass (no second
implementation for visualisation). While capturing, attention takes its explicit path so that the
weights exist. The idea is TransformerLens's ``run_with_cache``, without hooks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

_store: ContextVar[dict[str, torch.Tensor] | None] = ContextVar("qkv_capture", default=None)


def is_capturing() -> bool:
    """True inside a :func:`capture` block."""
    return _store.get() is not None


def record(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Store ``tensor`` as ``<module's dotted name>.<name>`` if a capture is active."""
    store = _store.get()
    if store is None:
        return
    prefix = getattr(module, "_capture_name", "")
    store[f"{prefix}.{name}" if prefix else name] = tensor.detach()


@contextmanager
def capture(model: nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """Collect every recorded activation of ``model`` run inside the block, keyed by dotted name."""
    for name, module in model.named_modules():
        module._capture_name = name  # type: ignore[attr-defined]
    acts: dict[str, torch.Tensor] = {}
    token = _store.set(acts)
    try:
        yield acts
    finally:
        _store.reset(token)
