"""A short ``repr`` for the views' results: what they hold, not every number.

A result keeps every number as attributes (arrays of (layers, heads, T, T), a 49,152-entry vocabulary's
logits and labels), so the repr a dataclass writes by default runs to thousands of lines under ``print`` or
at a Python prompt. :class:`ShortRepr` writes one line per result instead, with each array as its shape and
dtype and each long list as its length and first items:

    LogitLens(kind='llama', tokens=['The', ' capital', ' of', ' France', ' is'], rows=[31 items: 'embedding',
    'block 0', 'block 1', ...], top_ids=array(31, 5, 5; int64), ...)

The numbers stay one attribute away (``lens.final_probs``), and ``to_dict()`` gives them all.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

ITEMS = 3  # the first items of a long list that the repr shows
LONG = 6  # lists longer than this are shortened
TEXT = 60  # characters of a string shown


def brief(value: Any, depth: int = 0) -> str:
    """``value`` in a few words: arrays and tensors by shape and dtype, long lists by length and first items."""
    if isinstance(value, np.ndarray | torch.Tensor):
        kind = "array" if isinstance(value, np.ndarray) else "tensor"
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{kind}({', '.join(str(n) for n in value.shape)}; {dtype})"
    if isinstance(value, torch.nn.Module):
        return f"<{type(value).__name__}>"
    if isinstance(value, str):
        return repr(value if len(value) <= TEXT else value[: TEXT - 1] + "…")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return short_repr(value, depth + 1) if depth < 1 else f"{type(value).__name__}(...)"
    if isinstance(value, dict):
        pairs = [f"{brief(k, depth + 1)}: {brief(v, depth + 1)}" for k, v in list(value.items())[:ITEMS]]
        more = f", ... {len(value)} keys" if len(value) > ITEMS else ""
        return "{" + ", ".join(pairs) + more + "}"
    if isinstance(value, list | tuple) and value and isinstance(value[0], list | tuple):
        sizes = []  # a nested list by its sizes: top_tokens is list(rows x T x k)
        while isinstance(value, list | tuple):
            sizes.append(len(value))
            value = value[0] if value else None
        return f"list({' x '.join(str(n) for n in sizes)})"
    if isinstance(value, list | tuple):
        open_, close = ("[", "]") if isinstance(value, list) else ("(", ")")
        if len(value) <= LONG and depth < 2:
            return open_ + ", ".join(brief(v, depth + 1) for v in value) + close
        shown = ", ".join(brief(v, depth + 1) for v in value[:ITEMS])
        return f"{open_}{len(value)} items: {shown}, ...{close}"
    return repr(value)


def short_repr(result: Any, depth: int = 0) -> str:
    """``Name(field=brief(value), ...)`` for a dataclass."""
    fields = ", ".join(f"{f.name}={brief(getattr(result, f.name), depth)}" for f in dataclasses.fields(result))
    return f"{type(result).__name__}({fields})"


class ShortRepr:
    """A base for result dataclasses declared with ``@dataclass(repr=False)``: their repr is :func:`short_repr`."""

    def __repr__(self) -> str:
        return short_repr(self)
