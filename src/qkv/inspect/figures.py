"""The pictures of :mod:`qkv.inspect`, drawn with matplotlib and saved as PNG.

The figures are matplotlib ``Figure`` objects made without pyplot (:func:`subplots`): no display is needed,
nothing is shown by accident, and the process's backend is left as it was, so a notebook's own
``plt.show()`` still draws after a qkv view has been drawn.

Every drawing function returns a :class:`Picture`: where the PNG went, its size in pixels and how many
panels it holds, so a caller (or a test) can check what was drawn without reading the image back.

- :func:`draw_attention`: a grid of attention maps, layers as rows and heads as columns (the Attention Is All
  You Need notes' "attend to all words ... to varying degrees"), or one map with its weights written in the
  cells;
- :func:`draw_next_token`: the top tokens' probabilities at several temperatures side by side (the GPT notes:
  T flattens or sharpens the softmax);
- :func:`draw_embedding_map`: token embeddings projected to 2-D, labelled (the GPT notes: "words with similar
  meanings tend to land near each other");
- :func:`draw_positional_table`: the positional-encoding table, positions x dimensions (the
  attention-mathematics notes' sines and cosines).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from qkv.errors import QkvError
from qkv.io import atomic_write

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from qkv.inspect.view_types import AttentionGroupView

DPI = 100
# One colour map per kind of quantity, in every picture: weights and probabilities in [0, 1], and signed
# values (red positive, blue negative, white zero).
UNIT_CMAP = "viridis"
SIGNED_CMAP = "RdBu_r"


@dataclass
class Picture:
    """A PNG written by one of the drawing functions."""

    path: Path
    width: int  # pixels
    height: int
    panels: int  # heatmaps or bar charts in the picture
    rows: int = 1
    columns: int = 1


def png_size(path: str | Path) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's header; QkvError if the file is not a PNG."""
    data = Path(path).read_bytes()[:24]
    if len(data) < 24 or data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise QkvError(f"{path} is not a PNG image: draw it again")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float],
             layout: Literal["constrained", "compressed", "tight"] | None = "constrained",
             **options) -> tuple[Figure, Any]:  # fmt: skip
    """``pyplot.subplots`` without pyplot: a new Figure and its axes (``options``: squeeze, sharey, gridspec_kw)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout=layout)
    return fig, fig.subplots(nrows, ncols, **options)


def colormap(name: str):
    """The matplotlib colour map ``name``."""
    import matplotlib

    return matplotlib.colormaps[name]


def save(fig: Figure, path: str | Path, panels: int, rows: int = 1, columns: int = 1) -> Picture:
    """Write ``fig`` to ``path`` as PNG (atomically) and describe the result."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise QkvError(f"{path} does not end in .png: pictures are written as PNG files")
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=DPI))
    width, height = png_size(path)
    return Picture(path, width, height, panels, rows, columns)


def _ticks(ax, labels: list[str], axis: str, fontsize: float, max_labels: int = 48) -> None:
    step = max(1, -(-len(labels) // max_labels))  # every step-th label when there are too many
    positions = list(range(0, len(labels), step))
    shown = [labels[i] for i in positions]
    if axis == "x":
        upright = all(len(label) <= 2 for label in shown)  # characters read best unrotated
        ax.set_xticks(positions, shown, rotation=0 if upright else 90, fontsize=fontsize)
    else:
        ax.set_yticks(positions, shown, fontsize=fontsize)


def draw_attention(
    group: AttentionGroupView,
    path: str | Path,
    *,
    layer: int | Sequence[int] | None = None,
    head: int | Sequence[int] | None = None,
    title: str = "",
    panel_title: str | None = None,
) -> Picture:
    """Heatmaps of ``group``'s weights: layers x heads (all, or the ``layer`` and ``head`` given: one number or
    several), or one map.

    Rows of every map are query tokens and columns key tokens; colours run from 0 to 1 on one shared scale.
    A grid is one mosaic, labelled "layer l" at the left and "head h" at the top, with the tokens along the
    left column's and bottom row's edges where they are large enough to read (30 layers x 9 heads stay
    legible, and drawing them takes a second). One map is titled "layer l, head h" (or ``panel_title``,
    for a map that is not one head's, such as a mean over heads) and has each weight written in its cell
    when it is small enough to read.
    """
    layers, heads = group.select(layer, head)
    if len(layers) * len(heads) > 1:
        return _draw_grid(group, layers, heads, path, title=title or group.title)
    (l,), (h,) = layers, heads
    n_q, n_k = len(group.query_tokens), len(group.key_tokens)
    longest = max(n_q, n_k)
    panel = min(10.0, max(3.5, 0.42 * longest + 1.5))
    fontsize = 10 if longest <= 24 else 7
    fig, ax = subplots(figsize=(panel + 1.6, panel + 1.2))
    weights = group.weights[l, h]  # (Tq, Tk)
    image = ax.imshow(weights, vmin=0.0, vmax=1.0, cmap=UNIT_CMAP, aspect="auto", interpolation="nearest")
    ax.set_title(f"layer {l}, head {h}" if panel_title is None else panel_title, fontsize=10)
    _ticks(ax, group.key_tokens, "x", fontsize)
    _ticks(ax, group.query_tokens, "y", fontsize)
    if longest <= 14:
        for i in range(n_q):
            for j in range(n_k):
                value = weights[i, j]
                color = "black" if value > 0.6 else "white"
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8, color=color)
    _axis_labels(fig, group)
    fig.suptitle(title or group.title, fontsize=11)
    fig.colorbar(image, ax=ax, shrink=0.8, label="attention weight")
    return save(fig, path, 1)


def _axis_labels(fig: Figure, group: AttentionGroupView) -> None:
    keys, queries = ("source token (key)", "target token (query)") if group.name == "cross" else ("key", "query")
    fig.supxlabel(f"{keys}: attended to", fontsize=9)
    fig.supylabel(f"{queries}: attending", fontsize=9)


def _draw_grid(
    group: AttentionGroupView, layers: list[int], heads: list[int], path: str | Path, *, title: str
) -> Picture:
    """Every (layer, head) map of ``layers`` x ``heads`` as tiles of one image, a blank band between tiles."""
    n_rows, n_cols = len(layers), len(heads)
    n_q, n_k = len(group.query_tokens), len(group.key_tokens)
    longest = max(n_q, n_k)
    panel = min(3.2, max(1.6, 0.11 * longest + 1.2), 24.0 / n_cols, 30.0 / n_rows)  # inches; under ~2600 x 3200 px
    gap = max(1, longest // 8)  # cells of blank between tiles
    mosaic = np.full((n_rows * (n_q + gap) - gap, n_cols * (n_k + gap) - gap), np.nan)
    for r, l in enumerate(layers):
        for c, h in enumerate(heads):
            mosaic[r * (n_q + gap) : r * (n_q + gap) + n_q, c * (n_k + gap) : c * (n_k + gap) + n_k] = group.weights[
                l, h
            ]
    fig, ax = subplots(figsize=(n_cols * panel + 2.6, n_rows * panel + 1.8))
    cmap = colormap(UNIT_CMAP).with_extremes(bad="white")  # the bands between tiles (NaN)
    image = ax.imshow(mosaic, vmin=0.0, vmax=1.0, cmap=cmap, aspect="auto", interpolation="nearest")
    ax.set_frame_on(False)
    rows = [r * (n_q + gap) + (n_q - 1) / 2 for r in range(n_rows)]
    columns = [c * (n_k + gap) + (n_k - 1) / 2 for c in range(n_cols)]
    ax.set_yticks(rows, [f"layer {l}" for l in layers], fontsize=8)
    top = ax.secondary_xaxis("top")
    top.set_xticks(columns, [f"head {h}" for h in heads], fontsize=8)
    top.tick_params(length=0)
    ax.tick_params(axis="y", length=0)
    cell = panel * DPI / (longest + gap)  # pixels per token
    fontsize = min(8.0, cell * 0.75)
    if fontsize >= 5:  # the tokens, where they can be read: keys under the bottom row, queries right of the grid
        ax.set_xticks([c * (n_k + gap) + j for c in range(n_cols) for j in range(n_k)],
                      group.key_tokens * n_cols, rotation=90, fontsize=fontsize)  # fmt: skip
        right = ax.secondary_yaxis("right")
        right.set_yticks([r * (n_q + gap) + i for r in range(n_rows) for i in range(n_q)],
                         group.query_tokens * n_rows, fontsize=fontsize)  # fmt: skip
        right.tick_params(length=0)
        right.spines["right"].set_visible(False)
    else:
        ax.set_xticks([])
    top.spines["top"].set_visible(False)
    _axis_labels(fig, group)
    fig.suptitle(title, fontsize=11)
    fig.colorbar(image, ax=ax, shrink=0.6, label="attention weight", location="right", pad=0.08)
    return save(fig, path, n_rows * n_cols, n_rows, n_cols)


def draw_next_token(
    tokens: list[str], probabilities: np.ndarray, temperatures: list[float], path: str | Path, *, title: str = ""
) -> Picture:
    """One horizontal bar chart per temperature, side by side, for the same top tokens (first = likeliest).

    ``probabilities`` is (n_temperatures, n_tokens). The x-axis is shared, so a low T's tall bar and a high
    T's flatter spread compare directly.
    """
    n_t, n = probabilities.shape
    fig, axes = subplots(1, n_t, squeeze=False, sharey=True, figsize=(2.9 * n_t + 1.2, 0.28 * n + 1.6))
    top = min(1.0, float(probabilities.max()) * 1.25) or 1.0  # room for the numbers after the bars
    positions = np.arange(n)
    colors = colormap("viridis")(np.linspace(0.15, 0.85, n_t))
    for k, (ax, temperature) in enumerate(zip(axes[0], temperatures, strict=True)):
        ax.barh(positions, probabilities[k], color=colors[k])
        for i, p in enumerate(probabilities[k]):
            ax.text(p + top * 0.01, i, f"{p:.3f}", va="center", fontsize=7)
        ax.set_xlim(0, top)
        ax.set_title(f"T = {temperature:g}  (top {n}: {probabilities[k].sum():.0%})", fontsize=10)
        ax.set_xlabel("probability", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(positions, tokens)
    axes[0][0].invert_yaxis()  # the likeliest token on top
    fig.suptitle(title or "next-token distribution softmax(logits / T)", fontsize=11)
    return save(fig, path, n_t, 1, n_t)


def draw_embedding_map(
    points: np.ndarray,
    labels: list[str],
    path: str | Path,
    *,
    explained: tuple[float, float] | None = None,
    title: str = "",
    highlight: list[int] | None = None,
) -> Picture:
    """A labelled scatter of 2-D points (N, 2), e.g. token embeddings projected on their first two principal
    components; ``explained`` is the fraction of variance each axis keeps."""
    fig, ax = subplots(figsize=(8.5, 7.0))
    ax.scatter(points[:, 0], points[:, 1], s=12, color="#4c72b0", alpha=0.7)
    fontsize = 9 if len(labels) <= 60 else 7 if len(labels) <= 150 else 5
    marked = set(highlight or [])
    for i, (x, y) in enumerate(points):
        style = dict(color="#c44e52", fontweight="bold") if i in marked else dict(color="black")
        ax.annotate(labels[i], (x, y), xytext=(2, 2), textcoords="offset points", fontsize=fontsize, **style)
    if explained is not None:
        ax.set_xlabel(f"principal component 1 ({explained[0]:.0%} of the variance)")
        ax.set_ylabel(f"principal component 2 ({explained[1]:.0%} of the variance)")
    ax.grid(alpha=0.3)
    ax.set_title(title or "token embeddings (rows of W_E), projected to 2-D", fontsize=11)
    return save(fig, path, 1)


def draw_positional_table(table: np.ndarray, path: str | Path, *, title: str = "") -> Picture:
    """The (positions, d_model) positional-encoding table as a heatmap: a row per position, a column per
    dimension. For the sinusoidal table the low dimensions oscillate fast and the high ones slowly."""
    length, width = table.shape
    fig, ax = subplots(figsize=(min(12.0, 3.0 + width * 0.05), min(8.0, 2.5 + length * 0.04)))
    limit = float(np.abs(table).max()) or 1.0
    image = ax.imshow(table, cmap=SIGNED_CMAP, vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest")
    ax.set_xlabel("dimension i of the encoding vector")
    ax.set_ylabel("position in the sequence")
    ax.set_title(title or "positional encoding PE[position, i]", fontsize=11)
    fig.colorbar(image, ax=ax, shrink=0.8)
    return save(fig, path, 1)
