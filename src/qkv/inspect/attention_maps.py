"""Attention maps: every layer's and head's weights softmax(Q K^T / sqrt(d_k) + mask) for one text.

The notes on Attention Is All You Need: "this process allows the model to attend to all words in the sentence
..., but to varying degrees". A map is that degree as a picture: row i is query token i, column j key token j,
and the cell is the weight alpha_ij, so each row sums to 1. The weights are the model's own, read from its
forward pass by :func:`~qkv.inspect.trace.trace` (the explicit attention path computes them before dropout), not
from a second implementation.

A GPT has one kind of attention (masked self-attention, lower-triangular maps); a translator has three:
encoder self-attention (source x source), decoder masked self-attention (target x target) and
cross-attention (target rows x source columns), where one can watch each output token look up the part
of the source it translates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from qkv.errors import QkvError
from qkv.inspect.summary import ShortRepr
from qkv.inspect.trace import Trace, check_range, trace
from qkv.model_dir import ModelBundle


@dataclass(repr=False)
class AttentionGroup(ShortRepr):
    """The weights of one kind of attention: (layers, heads, queries, keys), rows summing to 1."""

    name: str  # "encoder", "decoder" or "cross"
    title: str
    causal: bool
    weights: np.ndarray  # (L, H, Tq, Tk)
    query_tokens: list[str]
    key_tokens: list[str]

    @property
    def n_layers(self) -> int:
        return self.weights.shape[0]

    @property
    def n_heads(self) -> int:
        return self.weights.shape[1]

    def select(self, layer: int | Sequence[int] | None = None,
               head: int | Sequence[int] | None = None) -> tuple[list[int], list[int]]:  # fmt: skip
        """The layers and heads to show: the one or several given, or all of them when None (a QkvError if one
        is out of range)."""
        layers = list(range(self.n_layers)) if layer is None else [layer] if isinstance(layer, int) else list(layer)
        heads = list(range(self.n_heads)) if head is None else [head] if isinstance(head, int) else list(head)
        if not layers or not heads:
            raise QkvError("no layer or no head to draw: give at least one of each (or none: all of them)")
        for l in layers:
            check_range(self.title, self.n_layers, self.n_heads, l, None)
        for h in heads:
            check_range(self.title, self.n_layers, self.n_heads, None, h)
        return layers, heads

    def _repr_png_(self) -> bytes:
        """Every layer x head as ``qkv attention`` draws it (:func:`~qkv.inspect.figures.draw_attention`)."""
        from qkv.inspect.figures import draw_attention
        from qkv.inspect.notebook import cached_png, png_bytes

        return cached_png(self, lambda: png_bytes(draw_attention, self))


@dataclass(repr=False)
class AttentionMaps(ShortRepr):
    """All attention maps of a model on one text (one :class:`AttentionGroup` per kind of attention)."""

    kind: str
    groups: dict[str, AttentionGroup]
    source_tokens: list[str]
    target_tokens: list[str] | None = None
    generated: bool = False  # the target is the model's greedy translation

    def to_dict(self, digits: int = 6) -> dict:
        """JSON-ready: tokens and weights rounded to ``digits`` decimals, per group."""
        return {
            "kind": self.kind,
            "source_tokens": self.source_tokens,
            "target_tokens": self.target_tokens,
            "generated": self.generated,
            "groups": {
                name: {
                    "title": g.title,
                    "causal": g.causal,
                    "query_tokens": g.query_tokens,
                    "key_tokens": g.key_tokens,
                    "weights": np.round(g.weights, digits).tolist(),
                }
                for name, g in self.groups.items()
            },
        }

    def main_group(self) -> AttentionGroup:
        """The kind a picture shows first: a translator's cross-attention (its alignment), else the first kind."""
        return self.groups.get("cross") or next(iter(self.groups.values()))

    def _repr_html_(self) -> str:
        """The page ``qkv attention --html`` writes (:func:`~qkv.inspect.html_view.attention_html`: pick the kind,
        layer and head, hover a cell), inside the notebook's output."""
        from qkv.inspect.html_view import attention_html
        from qkv.inspect.notebook import page_frame

        rows = max(len(g.query_tokens) for g in self.groups.values())
        return page_frame(attention_html(self), height=320 + 23 * rows, title="attention maps")

    def _repr_png_(self) -> bytes:
        """:meth:`main_group` drawn as ``qkv attention`` draws it: every layer x head."""
        return self.main_group()._repr_png_()


def maps_from_trace(traced: Trace) -> AttentionMaps:
    """Stack the captured ``...weights`` of every layer into one (L, H, Tq, Tk) array per kind of attention."""
    groups = {}
    for name, part in traced.parts.items():
        layers = [traced.attention(part, i, "weights").double().cpu().numpy() for i in range(part.n_layers)]
        groups[name] = AttentionGroup(
            name=name,
            title=part.title,
            causal=part.causal,
            weights=np.stack(layers),  # (L, H, Tq, Tk)
            query_tokens=traced.tokens(part.queries),
            key_tokens=traced.tokens(part.keys),
        )
    return AttentionMaps(traced.kind, groups, traced.source_tokens, traced.target_tokens, traced.generated)


def attention_maps(bundle: ModelBundle, text: str, *, target: str | None = None) -> AttentionMaps:
    """The attention weights of ``bundle``'s model on ``text``: every layer, every head, every kind.

    For a translator, ``text`` is the source; the target is ``target`` or, if None, the model's own greedy
    translation (fed back teacher-forced after ``<bos>``, so row t is the query that predicted token t+1).
    """
    return maps_from_trace(trace(bundle, text, target=target))
