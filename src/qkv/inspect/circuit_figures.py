"""The pictures of the logit lens, direct logit attribution, activation patching and the head detector.

Same style as :mod:`qkv.inspect.figures` (matplotlib figures without pyplot, PNG written atomically, a
:class:`~qkv.inspect.figures.Picture` returned): probabilities and scores in [0, 1] on viridis, signed
numbers (contributions, recovered fractions) on a red-white-blue scale centred on 0 (blue pushes up /
recovers, red pushes down), the same colours as the attribution's bars. Each function draws one result
dataclass and computes nothing itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qkv.inspect.figures import UNIT_CMAP, Picture, _ticks, save, subplots

if TYPE_CHECKING:
    from qkv.inspect.view_types import AttributionView, HeadDetectionView, LensView, PatchingView


def _short(label: str, width: int = 7) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def _write_cells(ax, texts: list[list[str]], dark: np.ndarray, fontsize: float) -> None:
    """Write each cell's text, white on the cells marked ``dark`` and black on the others."""
    for r, row in enumerate(texts):
        for c, text in enumerate(row):
            color = "white" if dark[r, c] else "black"
            ax.text(c, r, text, ha="center", va="center", fontsize=fontsize, color=color)


def _numbers(values: np.ndarray) -> list[list[str]]:
    return [[f"{v:.2f}" for v in row] for row in values]


def draw_logit_lens(lens: LensView, path: str | Path, *, color: str = "final", title: str = "") -> Picture:
    """Rows = where the stream was read (embedding at the bottom), columns = positions; each cell is coloured
    by the probability of the model's final prediction there (``color="final"``) or of that row's own top
    token (``"top"``), and shows that row's top token when the grid is small enough to read."""
    if color not in ("final", "top"):
        raise ValueError(f"color must be 'final' or 'top', got {color!r}")
    values = lens.final_probs if color == "final" else lens.top_probs[:, :, 0]  # (rows, T)
    n_rows, n_cols = values.shape
    width = min(24.0, max(6.0, 0.62 * n_cols + 3.0))
    height = min(20.0, max(3.5, 0.42 * n_rows + 2.2))
    fig, ax = subplots(figsize=(width, height))
    image = ax.imshow(values, vmin=0.0, vmax=1.0, cmap=UNIT_CMAP, aspect="auto", origin="lower",
                      interpolation="nearest")  # fmt: skip
    if n_cols <= 40 and n_rows <= 40:
        texts = [[_short(lens.top_tokens[r][c][0]) for c in range(n_cols)] for r in range(n_rows)]
        _write_cells(ax, texts, values < 0.6, 7 if n_cols <= 20 else 6)
    _ticks(ax, lens.tokens, "x", 8)
    ax.set_yticks(range(n_rows), lens.rows, fontsize=8)
    top = ax.secondary_xaxis("top")
    _ticks(top, [_short(t, 10) for t in lens.final_tokens], "x", 8)
    top.set_xlabel("the model's prediction (last row's top token)", fontsize=9)
    ax.set_xlabel("input token (position)", fontsize=9)
    ax.set_ylabel("residual stream read after", fontsize=9)
    what = "P(final prediction)" if color == "final" else "P(this row's top token)"
    ax.set_title(title or f"logit lens: softmax(W_U norm(x)), colour = {what}", fontsize=11)
    fig.colorbar(image, ax=ax, shrink=0.8, label=what)
    return save(fig, path, 1)


CIRCUIT_CMAP = "RdBu"  # signed: blue positive (pushes the answer up, recovers it), red negative, white 0


def _diverging(ax, values: np.ndarray, limit: float):
    return ax.imshow(values, cmap=CIRCUIT_CMAP, vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest")


def draw_attribution(result: AttributionView, path: str | Path, *, title: str = "") -> Picture:
    """Left: each part's contribution as a bar (blue pushes the target up, red down); right: every head's
    contribution, layers x heads (a second heatmap for a translator's cross-attention heads)."""
    terms = result.terms()
    head_maps = [("self-attention heads", result.heads)]
    if result.cross_heads is not None:
        head_maps.append(("cross-attention heads", result.cross_heads))
    n_layers, n_heads = result.heads.shape
    height = min(20.0, max(4.0, 0.28 * len(terms) + 1.8, 0.45 * n_layers + 2.0))
    widths = [1.3] + [max(0.6, 0.12 * n_heads + 0.4)] * len(head_maps)
    fig, axes = subplots(1, 1 + len(head_maps), figsize=(5.5 + 3.2 * len(head_maps), height),
                         gridspec_kw={"width_ratios": widths})  # fmt: skip
    bars = axes[0]
    values = np.array([v for _, v in terms])
    colors = ["#4c72b0" if v >= 0 else "#c44e52" for v in values]
    positions = np.arange(len(terms))
    bars.barh(positions, values, color=colors)
    bars.set_yticks(positions, [label for label, _ in terms], fontsize=8)
    bars.invert_yaxis()
    bars.axvline(0, color="black", linewidth=0.8)
    bars.grid(axis="x", alpha=0.3)
    bars.set_xlabel("contribution to the logit", fontsize=9)
    bars.set_title(f"parts (sum {result.total():.3f} = logit {result.logit:.3f})", fontsize=10)
    limit = max(float(np.abs(m).max()) for _, m in head_maps) or 1.0
    image = None
    for ax, (name, heads) in zip(axes[1:], head_maps, strict=True):
        image = _diverging(ax, heads, limit)
        ax.set_xticks(range(n_heads), [str(h) for h in range(n_heads)], fontsize=8)
        ax.set_yticks(range(heads.shape[0]), [f"block {i}" for i in range(heads.shape[0])], fontsize=8)
        ax.set_xlabel("head", fontsize=9)
        ax.set_title(name, fontsize=10)
        if heads.size <= 200:
            _write_cells(ax, _numbers(heads), np.abs(heads) > 0.6 * limit, 7)
    assert image is not None  # the loop above drew at least one panel
    fig.colorbar(image, ax=axes[1:].tolist(), shrink=0.8, label="contribution")
    what = f"logit({result.target_token!r})"
    if result.foil_token is not None:
        what += f" - logit({result.foil_token!r})"
    token = result.tokens[result.position]
    fig.suptitle(title or f"direct logit attribution of {what} after {token!r} (position {result.position})",
                 fontsize=11)  # fmt: skip
    return save(fig, path, 1 + len(head_maps), 1, 1 + len(head_maps))


def draw_patching(result: PatchingView, path: str | Path, *, title: str = "") -> Picture:
    """One heatmap per map of ``result`` (residual: rows x positions, heads: layers x heads), the recovered
    fraction on a shared scale from -1 to 1 (0 = as corrupt, 1 = as clean)."""
    maps = result.maps
    widths = [max(1.0, 0.45 * len(m.columns) + 1.0) for m in maps]
    height = min(12.0, max(3.5, 0.45 * max(len(m.rows) for m in maps) + 2.4))
    fig, axes = subplots(1, len(maps), squeeze=False, figsize=(min(30.0, sum(widths) + 2.5), height),
                         gridspec_kw={"width_ratios": widths})  # fmt: skip
    image = None
    for ax, m in zip(axes[0], maps, strict=True):
        image = _diverging(ax, m.values, 1.0)
        if m.column_axis == "position":
            _ticks(ax, m.columns, "x", 8)
        else:
            ax.set_xticks(range(len(m.columns)), m.columns, fontsize=8)
        ax.set_yticks(range(len(m.rows)), m.rows, fontsize=8)
        ax.set_xlabel(m.column_axis, fontsize=9)
        ax.set_title(m.title, fontsize=10)
        if m.values.size <= 300:
            _write_cells(ax, _numbers(m.values), np.abs(m.values) > 0.6, 6 if len(m.columns) > 16 else 7)
    assert image is not None  # the loop above drew at least one panel
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="recovered (0 = corrupt, 1 = clean)")
    what = f"logit({result.target_token!r}) - logit({result.foil_token!r})"
    fig.suptitle(title or f"activation patching, clean into corrupt: {what}", fontsize=11)
    return save(fig, path, len(maps), 1, len(maps))


def draw_head_scores(detection: HeadDetectionView, path: str | Path, *, title: str = "") -> Picture:
    """A grid of heatmaps: a row per kind of self-attention, a column per score; layers x heads each, 0..1."""
    parts = detection.parts
    names = list(parts[0].scores)
    n_layers = max(p.n_layers for p in parts)
    n_heads = max(p.n_heads for p in parts)
    panel_w = min(4.0, max(2.0, 0.3 * n_heads + 1.0))
    panel_h = min(5.0, max(1.8, 0.3 * n_layers + 1.0))
    fig, axes = subplots(len(parts), len(names), squeeze=False,
                         figsize=(panel_w * len(names) + 1.5, panel_h * len(parts) + 1.0))  # fmt: skip
    image = None
    for r, part in enumerate(parts):
        for c, name in enumerate(names):
            ax = axes[r][c]
            values = part.scores[name]
            image = ax.imshow(values, vmin=0.0, vmax=1.0, cmap=UNIT_CMAP, aspect="auto", interpolation="nearest")
            ax.set_title(name if len(parts) == 1 else f"{part.part}: {name}", fontsize=9)
            ax.set_xticks(range(part.n_heads), [str(h) for h in range(part.n_heads)], fontsize=7)
            ax.set_yticks(range(part.n_layers), [str(i) for i in range(part.n_layers)], fontsize=7)
            if values.size <= 150:
                _write_cells(ax, _numbers(values), values < 0.6, 6)
            if c == 0:
                ax.set_ylabel("layer", fontsize=8)
            ax.set_xlabel("head", fontsize=8)
    assert image is not None  # the loop above drew at least one panel
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.7, label="mean attention weight")
    fig.suptitle(title or f"head scores on {detection.batch} random sequences of {detection.length} tokens, "
                 "each repeated twice", fontsize=11)  # fmt: skip
    return save(fig, path, len(parts) * len(names), len(parts), len(names))
