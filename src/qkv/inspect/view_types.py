"""The results of :mod:`qkv.inspect` as the pictures and pages read them: one Protocol per result.

Each result's notebook hook (``_repr_png_``, ``_repr_html_``) calls its renderer (:mod:`~qkv.inspect.figures`,
:mod:`~qkv.inspect.html_view`, :mod:`~qkv.inspect.circuit_figures`, :mod:`~qkv.inspect.circuit_views`,
:mod:`~qkv.inspect.walkthrough_html`), so a renderer that named the result's class would import its caller: a
circle. The renderers name these Protocols instead; the result classes match them by their fields alone (the
type checker checks that at every call), and this module imports no result module. Shapes: L layers (blocks),
H heads, T positions, R rows of a logit lens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np


class AttentionGroupView(Protocol):
    """One kind of attention (:class:`~qkv.inspect.attention_maps.AttentionGroup`)."""

    @property
    def name(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def weights(self) -> np.ndarray: ...  # (L, H, Tq, Tk)
    @property
    def query_tokens(self) -> list[str]: ...
    @property
    def key_tokens(self) -> list[str]: ...
    def select(
        self, layer: int | Sequence[int] | None = None, head: int | Sequence[int] | None = None
    ) -> tuple[list[int], list[int]]: ...


class AttentionMapsView(Protocol):
    """Every attention map of one text (:class:`~qkv.inspect.attention_maps.AttentionMaps`)."""

    @property
    def source_tokens(self) -> list[str]: ...
    @property
    def target_tokens(self) -> list[str] | None: ...
    @property
    def generated(self) -> bool: ...
    def to_dict(self, digits: int = 6) -> dict[Any, Any]: ...


class LensView(Protocol):
    """The logit lens (:class:`~qkv.inspect.lens.LogitLens`)."""

    @property
    def tokens(self) -> list[str]: ...
    @property
    def rows(self) -> list[str]: ...
    @property
    def top_tokens(self) -> list[list[list[str]]]: ...  # [R][T][k]
    @property
    def top_probs(self) -> np.ndarray: ...  # (R, T, k)
    @property
    def final_tokens(self) -> list[str]: ...
    @property
    def final_probs(self) -> np.ndarray: ...  # (R, T)
    @property
    def final_ranks(self) -> np.ndarray: ...  # (R, T)
    @property
    def norm(self) -> str: ...


class AttributionView(Protocol):
    """Direct logit attribution (:class:`~qkv.inspect.attribution.Attribution`)."""

    @property
    def tokens(self) -> list[str]: ...
    @property
    def position(self) -> int: ...
    @property
    def target_token(self) -> str: ...
    @property
    def foil_token(self) -> str | None: ...
    @property
    def logit(self) -> float: ...
    @property
    def heads(self) -> np.ndarray: ...  # (L, H)
    @property
    def cross_heads(self) -> np.ndarray | None: ...  # (L, H)
    def total(self) -> float: ...
    def terms(self) -> list[tuple[str, float]]: ...
    def top_heads(self, n: int, *, cross: bool = False) -> list[tuple[int, int, float]]: ...


class PatchMapView(Protocol):
    """One map of activation patching (:class:`~qkv.inspect.patching.PatchMap`)."""

    @property
    def title(self) -> str: ...
    @property
    def rows(self) -> list[str]: ...
    @property
    def columns(self) -> list[str]: ...
    @property
    def column_axis(self) -> str: ...
    @property
    def values(self) -> np.ndarray: ...  # (rows, columns)


class PatchingView(Protocol):
    """Activation patching (:class:`~qkv.inspect.patching.Patching`)."""

    @property
    def target_token(self) -> str: ...
    @property
    def foil_token(self) -> str: ...
    @property
    def clean_difference(self) -> float: ...
    @property
    def corrupt_difference(self) -> float: ...
    @property
    def maps(self) -> Sequence[PatchMapView]: ...


class HeadScoresView(Protocol):
    """The head scores of one kind of self-attention (:class:`~qkv.inspect.heads.HeadScores`)."""

    @property
    def part(self) -> str: ...
    @property
    def scores(self) -> dict[str, np.ndarray]: ...  # name: (L, H)
    @property
    def n_layers(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    def top(self, score: str, n: int = 5) -> list[tuple[int, int, float]]: ...


class HeadDetectionView(Protocol):
    """Head detection (:class:`~qkv.inspect.heads.HeadDetection`)."""

    @property
    def length(self) -> int: ...
    @property
    def batch(self) -> int: ...
    @property
    def parts(self) -> Sequence[HeadScoresView]: ...


class WalkthroughView(Protocol):
    """The walk-through of a GPT's forward pass (:class:`~qkv.inspect.walkthrough.Walkthrough`)."""

    @property
    def tokens(self) -> list[str]: ...
    @property
    def lens(self) -> LensView: ...
    @property
    def vocab_labels(self) -> list[str] | None: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    def to_dict(self, digits: int = 4, *, logits: bool = False) -> dict[Any, Any]: ...
