"""The walk-through as one standalone HTML file: the playground's view of a GPT's forward pass, offline.

The page carries everything inside it: the playground's own stylesheets and ``walkthrough.js`` (read from
``qkv/server/static``, so the file and the playground draw the same way), and the numbers of
:func:`~qkv.inspect.walkthrough.walkthrough` as JSON, including the last position's logits and every
vocabulary label. Without a server to ask, the last step's probabilities are recomputed in the page by
``QkvWalkthrough.samplingDistribution``, a line-for-line copy of
:func:`qkv.decoding.sampling.sampling_distribution` (the tests compare the two).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TYPE_CHECKING

from qkv.io import atomic_write_text

if TYPE_CHECKING:
    from qkv.inspect.view_types import WalkthroughView

STATIC = Path(__file__).resolve().parents[1] / "server" / "static"

_BOOT = """
const DATA = JSON.parse(document.getElementById("walkthrough-data").textContent);
QkvWalkthrough.render(document.getElementById("walkthrough-view"), DATA, QkvWalkthrough.localProbabilities(DATA));
document.getElementById("walkthrough-view").dataset.state = "shown";
document.body.dataset.ready = "1";
"""


def _inline(text: str) -> str:
    """Text safe inside a <script> or <style> element: no "</" can close it early."""
    return text.replace("</", "<\\/")


def walkthrough_html(walk: WalkthroughView, *, title: str = "Walk-through", digits: int = 4) -> str:
    """The page as a string; ``walk`` must carry the vocabulary labels (``walkthrough(..., vocab=True)``)."""
    if walk.vocab_labels is None:
        raise ValueError("the standalone page needs every vocabulary label: call walkthrough(..., vocab=True)")
    data = _inline(json.dumps(walk.to_dict(digits, logits=True), ensure_ascii=False, separators=(",", ":")))
    style = (STATIC / "style.css").read_text(encoding="utf-8") + (STATIC / "walkthrough.css").read_text(
        encoding="utf-8"
    )
    script = (STATIC / "walkthrough.js").read_text(encoding="utf-8")
    text = html.escape("".join(walk.tokens))
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{_inline(style)}</style>
</head>
<body>
<header><h1>{html.escape(title)}</h1>
<p id="model-info">The forward pass on <code>{text}</code>: {len(walk.tokens)} tokens, {walk.n_layers} blocks of
{walk.n_heads} heads. Click any cell, bar or row for its numbers; layers, heads and positions count from 0.</p>
</header>
<main><div id="walkthrough-view" data-state="empty"></div></main>
<script type="application/json" id="walkthrough-data">{data}</script>
<script>{_inline(script)}</script>
<script>{_BOOT}</script>
</body>
</html>
"""


def write_walkthrough_html(walk: WalkthroughView, path: str | Path, *, title: str = "Walk-through") -> Path:
    """Write :func:`walkthrough_html` to ``path`` (atomically) and return the path."""
    path = Path(path)
    atomic_write_text(path, walkthrough_html(walk, title=title))
    return path
