"""The notebook renderings of the residual-stream views: the logit lens, attribution, patching, head scores and
the walk-through. Each result's ``_repr_png_`` / ``_repr_html_`` calls one function here.

The pictures are the CLI's own (:mod:`~qkv.inspect.circuit_figures`, what ``qkv lens``, ``qkv attribute``,
``qkv patch`` and ``qkv heads`` write); the HTML puts that picture above a small table of the numbers that
matter, so the output's text holds them too. The walk-through is the page ``qkv lens --html`` writes
(:mod:`~qkv.inspect.walkthrough_html`, the playground's ``walkthrough.js``) inside the output, with its live
temperature, top-k and top-p. Nothing here computes: the results arrive finished, read through the Protocols of
:mod:`~qkv.inspect.view_types` (so that their modules import this one without a circle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qkv.inspect import circuit_figures as figures
from qkv.inspect.notebook import cached_png, figure_html, page_frame, png_bytes, table_html

if TYPE_CHECKING:
    from qkv.inspect.view_types import AttributionView, HeadDetectionView, LensView, PatchingView, WalkthroughView


def lens_png(lens: LensView) -> bytes:
    return cached_png(lens, lambda: png_bytes(figures.draw_logit_lens, lens))


def lens_html(lens: LensView, position: int = -1) -> str:
    """The heatmap, and at ``position`` (default the last) every row's top token with P(final prediction)."""
    t = range(len(lens.tokens))[position]
    final = lens.final_tokens[t]
    rows = [
        (row, repr(lens.top_tokens[r][t][0]), float(lens.top_probs[r, t, 0]), float(lens.final_probs[r, t]),
         int(lens.final_ranks[r, t]) + 1)
        for r, row in enumerate(lens.rows)
    ]  # fmt: skip
    caption = f"at position {t} ({lens.tokens[t]!r}) the model predicts {final!r}; read through {lens.norm}"
    table = table_html(["read after", "top token", "P(top)", f"P({final!r})", "rank"], rows, caption=caption)
    return figure_html(lens_png(lens), alt="logit lens", numbers=table)


def attribution_png(result: AttributionView) -> bytes:
    return cached_png(result, lambda: png_bytes(figures.draw_attribution, result))


def attribution_html(result: AttributionView) -> str:
    """The bars and head maps, then every part's contribution and the largest heads."""
    what = f"logit({result.target_token!r})" + (f" - logit({result.foil_token!r})" if result.foil_token else "")
    caption = (
        f"{what} = {result.logit:.4f} after {result.tokens[result.position]!r}; the parts sum to {result.total():.4f}"
    )
    parts = table_html(["part", "contribution"], result.terms(), caption=caption)
    heads = table_html(["layer", "head", "contribution"], result.top_heads(5), caption="the largest heads")
    return figure_html(attribution_png(result), alt="direct logit attribution", numbers=parts + heads)


def patching_png(result: PatchingView) -> bytes:
    return cached_png(result, lambda: png_bytes(figures.draw_patching, result))


def patching_html(result: PatchingView) -> str:
    """The maps, then the clean and corrupt differences and each map's strongest site."""
    what = f"logit({result.target_token!r}) - logit({result.foil_token!r})"
    rows = []
    for m in result.maps:
        r, c = divmod(int(abs(m.values).argmax()), m.values.shape[1])
        rows.append((m.title, m.rows[r], f"{m.column_axis} {m.columns[c]}", float(m.values[r, c])))
    caption = f"{what}: clean {result.clean_difference:.4f}, corrupt {result.corrupt_difference:.4f}"
    table = table_html(["map", "row", "column", "recovered"], rows, caption=caption)
    return figure_html(patching_png(result), alt="activation patching", numbers=table)


def heads_png(detection: HeadDetectionView) -> bytes:
    return cached_png(detection, lambda: png_bytes(figures.draw_head_scores, detection))


def heads_html(detection: HeadDetectionView) -> str:
    """The score maps, then the best head of every score."""
    rows = []
    for part in detection.parts:
        for name in part.scores:
            layer, head, score = part.top(name, 1)[0]
            rows.append((part.part, name, layer, head, score))
    caption = f"on {detection.batch} random sequences of {detection.length} tokens, each repeated twice"
    table = table_html(["part", "score", "layer", "head", "score"], rows, caption=caption)
    return figure_html(heads_png(detection), alt="head scores", numbers=table)


def walkthrough_view(walk: WalkthroughView) -> str:
    """The standalone walk-through page in the output; without the vocabulary labels (``walkthrough(...,
    vocab=True)``) the page cannot redo the sampling, so the output is the logit lens of the same pass."""
    if walk.vocab_labels is None:
        note = "<p>(the walk-through page needs every vocabulary label: <code>walkthrough(..., vocab=True)</code>; "
        return note + "here is the logit lens of the same pass)</p>" + lens_html(walk.lens)
    from qkv.inspect.walkthrough_html import walkthrough_html

    title = "walk-through of " + "".join(walk.tokens)
    return page_frame(walkthrough_html(walk, title="Walk-through"), height=900, title=title)
