"""The embedding views as results that show themselves: nearest neighbours (or an analogy's answers), the 2-D
map of W_E and the positional table.

:mod:`~qkv.inspect.embeddings` computes (cosine similarities, a - b + c, PCA); this module only keeps its
answers in small dataclasses so that a notebook can show them: a table of tokens and cosines, and the
pictures ``qkv embeddings`` draws (:func:`~qkv.inspect.figures.draw_embedding_map`,
:func:`~qkv.inspect.figures.draw_positional_table`).

>>> import qkv
>>> views = qkv.views("runs/shakespeare")                    # doctest: +SKIP
>>> views.neighbours("e")                                    # doctest: +SKIP
>>> views.embedding_map()                                    # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from qkv.inspect import embeddings as emb
from qkv.inspect.summary import ShortRepr
from qkv.model_dir import ModelBundle


@dataclass(repr=False)
class Neighbours(ShortRepr):
    """The tokens nearest by cosine to ``query`` (one token, or an analogy "a - b + c"), most similar first."""

    query: str
    answers: list[tuple[str, float]]  # (token, cosine similarity)
    note: str = ""  # what was left out

    def to_dict(self) -> dict:
        return {"query": self.query, "answers": [[t, s] for t, s in self.answers], "note": self.note}

    def _repr_html_(self) -> str:
        from qkv.inspect.notebook import table_html

        rows = [(rank, repr(token), sim) for rank, (token, sim) in enumerate(self.answers, start=1)]
        caption = f"nearest to {self.query} by cosine similarity" + (f" ({self.note})" if self.note else "")
        return table_html(["#", "token", "cosine"], rows, caption=caption)


@dataclass(repr=False)
class EmbeddingMap(ShortRepr):
    """Rows of W_E projected on their first two principal components (:func:`~qkv.inspect.embeddings.pca_2d`)."""

    labels: list[str]
    points: np.ndarray  # (N, 2)
    explained: tuple[float, float]  # the fraction of the variance each axis keeps
    title: str

    def _repr_png_(self) -> bytes:
        from qkv.inspect.figures import draw_embedding_map
        from qkv.inspect.notebook import cached_png, png_bytes

        draw = partial(draw_embedding_map, self.points, self.labels, explained=self.explained, title=self.title)
        return cached_png(self, partial(png_bytes, draw))

    def _repr_html_(self) -> str:
        from qkv.inspect.notebook import figure_html

        a, b = self.explained
        note = f"<p>{len(self.labels)} tokens; the two axes keep {a:.1%} and {b:.1%} of the variance.</p>"
        return figure_html(self._repr_png_(), alt=self.title, numbers=note)


@dataclass(repr=False)
class PositionalTable(ShortRepr):
    """The (positions, d_model) positional encodings a model adds (:func:`~qkv.inspect.embeddings.positional_table`)."""

    table: np.ndarray
    title: str

    def _repr_png_(self) -> bytes:
        from qkv.inspect.figures import draw_positional_table
        from qkv.inspect.notebook import cached_png, png_bytes

        return cached_png(self, partial(png_bytes, draw_positional_table, self.table, title=self.title))

    def _repr_html_(self) -> str:
        from qkv.inspect.notebook import figure_html

        length, width = self.table.shape
        note = f"<p>{length} positions x {width} dimensions; PE[0, :4] = {np.round(self.table[0, :4], 4).tolist()}</p>"
        return figure_html(self._repr_png_(), alt=self.title, numbers=note)


def neighbours(bundle: ModelBundle, token: str, *, k: int = 5, target: bool = False) -> Neighbours:
    """:func:`~qkv.inspect.embeddings.neighbours_of` as a :class:`Neighbours`."""
    found = emb.neighbours_of(bundle, token, k=k, target=target)
    return Neighbours(repr(token), found, note="the token itself and special tokens left out")


def analogy(bundle: ModelBundle, a: str, b: str, c: str, *, k: int = 5, target: bool = False) -> Neighbours:
    """:func:`~qkv.inspect.embeddings.analogy_of` (a - b + c) as a :class:`Neighbours`."""
    found = emb.analogy_of(bundle, a, b, c, k=k, target=target)
    return Neighbours(f"{a!r} - {b!r} + {c!r}", found, note="a, b, c and special tokens left out")


def embedding_map(
    bundle: ModelBundle, *, tokens: list[str] | None = None, top: int | None = None, target: bool = False
) -> EmbeddingMap:
    """The map ``qkv embeddings --plot`` draws: the given ``tokens`` (or the first ``top`` ids) on W_E's first two
    principal components."""
    table, tokenizer = emb.embedding_matrix(bundle, target=target)
    ids = emb.tokens_to_plot(tokenizer, tokens=tokens, top=top)
    points, explained = emb.pca_2d(table[ids])
    labels = [emb.token_label(tokenizer, i) for i in ids]
    title = f"token embeddings W_E of {bundle.path.name}: {len(ids)} tokens on their first two principal components"
    return EmbeddingMap(labels, points, explained, title)


def positions(bundle: ModelBundle | None, *, length: int = 64, d_model: int = 64) -> PositionalTable:
    """The picture ``qkv embeddings --positions`` draws, as a :class:`PositionalTable`."""
    return PositionalTable(*emb.positional_table(bundle, length=length, d_model=d_model))
