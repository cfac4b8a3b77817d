"""Named activations: one light way to look inside a forward pass, and to change it.

Every module that computes something a learner wants to see (queries, keys, values, attention weights,
each head's output, what each sublayer adds to the residual stream, block outputs, logits) passes it
through :func:`record` with a short name and uses what comes back. Normally that returns the tensor
untouched. Inside ``with capture(model) as acts:`` each call also stores a detached copy under the
module's dotted name, so

    with capture(model) as acts:
        model(token_ids)
    acts["decoder.blocks.0.self_attn.weights"]      # (B, n_heads, T, T), rows sum to 1

gives the attention weights of the first block, computed by the model's own forward pass (no second
implementation for visualisation). Inside ``with intervene(model, {name: edit}):`` the activation called
``name`` is replaced by ``edit(activation)`` on its way through the model, which is what activation
patching needs (put the clean run's value into a corrupted run, one layer or head at a time). While
capturing or intervening, attention takes its explicit path so that its weights exist. The idea is
TransformerLens's ``run_with_cache`` and hooks, without hooks.

Under ``torch.compile`` there is nothing to capture: the compiled graph has no taps (``record`` returns its
tensor at once, and Dynamo traces no lookup), so capture and interventions run in eager mode.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from qkv.errors import QkvError

Edit = Callable[[Tensor], Tensor]


@dataclass
class _Taps:
    """What is active in this thread (or asyncio task): a store for captured tensors, edits by name."""

    store: dict[str, Tensor] | None = None
    edits: dict[str, Edit] = field(default_factory=dict)
    applied: set[str] = field(default_factory=set)


_active: ContextVar[_Taps | None] = ContextVar("qkv_taps", default=None)


def _taps() -> _Taps | None:
    if torch.compiler.is_compiling():  # constant for Dynamo: the lookup below is never traced
        return None
    return _active.get()


def is_capturing() -> bool:
    """True inside a :func:`capture` or :func:`intervene` block (attention then returns its weights)."""
    return _taps() is not None


def record(module: nn.Module, name: str, tensor: Tensor) -> Tensor:
    """``tensor``, edited if an :func:`intervene` block names it, and stored if a :func:`capture` is active.

    The name is ``<module's dotted name>.<name>``. Callers use the returned tensor in place of their own.
    """
    taps = _taps()
    if taps is None:
        return tensor
    prefix = getattr(module, "_capture_name", "")
    key = f"{prefix}.{name}" if prefix else name
    edit = taps.edits.get(key)
    if edit is not None:
        edited = edit(tensor)
        if not isinstance(edited, Tensor) or edited.shape != tensor.shape:
            raise QkvError(
                f"the edit of {key} must return a tensor of shape {tuple(tensor.shape)}, got "
                f"{getattr(edited, 'shape', type(edited).__name__)}: return a tensor like the one it was given"
            )
        tensor = edited
        taps.applied.add(key)
    if taps.store is not None:
        taps.store[key] = tensor.detach()
    return tensor


def _name_modules(model: nn.Module) -> None:
    for name, module in model.named_modules():
        module._capture_name = name


@contextmanager
def capture(model: nn.Module) -> Iterator[dict[str, Tensor]]:
    """Collect every recorded activation of ``model`` run inside the block, keyed by dotted name."""
    _name_modules(model)
    outer = _active.get()
    acts: dict[str, Tensor] = {}
    taps = _Taps(store=acts, edits=dict(outer.edits), applied=outer.applied) if outer else _Taps(store=acts)
    token = _active.set(taps)
    try:
        yield acts
    finally:
        _active.reset(token)


@contextmanager
def intervene(model: nn.Module, edits: Mapping[str, Edit]) -> Iterator[None]:
    """Replace the activations named in ``edits`` by ``edit(activation)`` in every forward pass inside.

    A name that no forward pass inside the block recorded is a QkvError (a typo would otherwise patch
    nothing and look like a result). Nested inside :func:`capture`, the edited values are what is captured.
    """
    _name_modules(model)
    outer = _active.get()
    if outer is None:
        taps = _Taps(edits=dict(edits))
    else:  # nested: keep the outer store, add to its edits, share the record of what was applied
        taps = _Taps(store=outer.store, edits={**outer.edits, **edits}, applied=outer.applied)
    token = _active.set(taps)
    try:
        yield
    finally:
        _active.reset(token)
    missing = sorted(set(edits) - taps.applied)
    if missing:
        raise QkvError(
            f"no activation named {', '.join(missing)} was recorded: capture a forward pass to list the names "
            "(e.g. decoder.blocks.0.output, decoder.blocks.0.self_attn.context)"
        )
