"""How a view's result shows itself in a Jupyter or VS Code notebook: the glue, never a second renderer.

Each result dataclass of :mod:`qkv.inspect` has ``_repr_html_`` (and ``_repr_png_`` where a picture is the
point), which IPython calls when the result is the last line of a cell. They draw with what the command
line and the offline pages already use, and this module only wraps that output for a notebook:

- :func:`png_bytes`: a drawing function of :mod:`~qkv.inspect.figures` or :mod:`~qkv.inspect.circuit_figures`
  (the CLI's PNG files) run into a temporary file and read back as bytes;
- :func:`page_frame`: a standalone page (:mod:`~qkv.inspect.html_view`, :mod:`~qkv.inspect.walkthrough_html`,
  whose JS and CSS are those of ``qkv/server/static`` read as files) inside an ``<iframe srcdoc>``. The page
  keeps its own document, so its element ids and globals cannot meet another output's, it needs no network
  (everything is inlined), and it still runs in an HTML export of the notebook (nbconvert keeps the iframe);
- :func:`rich_html`: a terminal renderer (rich, as ``qkv explain`` and ``qkv next`` print) recorded to HTML;
- :func:`figure_html` and :func:`table_html`: the PNG as an ``<img>`` with a small table of the numbers that
  matter (the top token and its probability, ...), so the text of the output carries them too;
- :func:`progress_line`: training in a notebook, one output line kept up to date (step, loss, time so far and
  left) instead of silence or a line per step.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_ids = itertools.count()

# Grows the iframe to its page's height, now and whenever the page changes size (a head picked, a panel
# opened). A srcdoc page shares its parent's origin, so it may reach its own <iframe> element.
_FIT = """<script>(function () {
  function fit() {
    var frame = window.frameElement;
    if (frame) frame.style.height = (document.documentElement.scrollHeight + 4) + "px";
  }
  window.addEventListener("load", fit);
  if (window.ResizeObserver) new ResizeObserver(fit).observe(document.body);
})();</script>"""


def png_bytes(draw: Callable[..., Any], *args: Any, **options: Any) -> bytes:
    """Run ``draw(*args, path, **options)`` (a function of figures.py or circuit_figures.py that writes a PNG
    file) into a temporary folder and return the file's bytes."""
    with tempfile.TemporaryDirectory(prefix="qkv-notebook-") as folder:
        path = Path(folder) / "view.png"
        draw(*args, path, **options)
        return path.read_bytes()


def cached_png(result: Any, draw: Callable[[], bytes]) -> bytes:
    """``draw()`` once per result object: IPython asks for the HTML (which embeds the PNG) and the PNG."""
    cache = result.__dict__.setdefault("_notebook_png", {})
    if "png" not in cache:
        cache["png"] = draw()
    return cache["png"]


def image_tag(png: bytes, alt: str) -> str:
    """An ``<img>`` carrying ``png`` inline (a data: URL), so the output needs no file next to it."""
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}" style="max-width:100%">'


def new_id(prefix: str = "qkv") -> str:
    """An id no other output of this Python process has (two outputs in one notebook never collide)."""
    return f"{prefix}-{next(_ids)}-{uuid.uuid4().hex[:8]}"


def page_frame(page: str, *, height: int = 480, title: str = "qkv view") -> str:
    """A standalone HTML ``page`` inside an iframe (srcdoc) that grows to the page's height."""
    page = page.replace("</body>", _FIT + "\n</body>", 1) if "</body>" in page else page + _FIT
    return (
        f'<iframe id="{new_id("qkv-frame")}" class="qkv-view" title="{html.escape(title)}" '
        f'srcdoc="{html.escape(page, quote=True)}" '
        f'style="width:100%;height:{height}px;border:1px solid #ddd;border-radius:4px" '
        'loading="eager"></iframe>'
    )


def rich_html(draw: Callable[[Any], None], *, width: int = 150) -> str:
    """What ``draw(console)`` prints on a rich console, as HTML (the terminal's own tables and colours).

    The console writes to a string only: in a notebook rich would otherwise display every ``print`` itself, a
    second copy of the table above the view's own (``force_jupyter=False``)."""
    from rich.console import Console

    console = Console(record=True, width=width, file=io.StringIO(), force_terminal=True, force_jupyter=False,
                      color_system="truecolor")  # fmt: skip
    draw(console)
    code = '<pre class="qkv-rich" style="font-family:ui-monospace,Menlo,monospace;font-size:12px;line-height:1.3">'
    return console.export_html(inline_styles=True, code_format=code + "{code}</pre>")


def table_html(header: Sequence[str], rows: Sequence[Sequence[Any]], *, caption: str = "") -> str:
    """A plain HTML table (cells escaped; floats with 4 digits)."""

    def cell(value: Any) -> str:
        return html.escape(f"{value:.4f}" if isinstance(value, float) else str(value))

    head = "".join(f"<th>{cell(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    title = f"<caption style='text-align:left'>{html.escape(caption)}</caption>" if caption else ""
    return f"<table class='qkv-numbers'>{title}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figure_html(png: bytes, *, alt: str, numbers: str = "") -> str:
    """The picture with the numbers that matter under it, in one ``<div>``."""
    return f"<div class='qkv-view'>{image_tag(png, alt)}{numbers}</div>"


def show_line(text: str, handle: dict[str, Any]) -> None:
    """``text`` as one line of output: in IPython a display that later calls update in place (``handle`` keeps
    its id), elsewhere a printed line."""
    try:
        from IPython import get_ipython
        from IPython.display import display, update_display
    except ImportError:  # no IPython: a printed line
        print(text, flush=True)
        return
    if get_ipython() is None:
        print(text, flush=True)
        return
    bundle = {"text/plain": text}
    if "id" in handle:
        update_display(bundle, display_id=handle["id"], raw=True)
    else:
        handle["id"] = new_id("qkv-progress")
        display(bundle, display_id=handle["id"], raw=True)


def progress_line(what: str, *, every: int = 20) -> Callable[[Any, int, Any], None]:
    """An ``on_step`` for qkv's trainers (``train_language_model(config, quiet=True, on_step=progress_line("the
    GPT"))``): every ``every`` steps and at the last, one line says the step, the loss, the seconds so far and
    about how many are left (from the pace since the first step seen), updated in place in a notebook."""
    handle: dict[str, Any] = {}
    started: list[float] = []  # (the time and step of the first call)

    def on_step(trainer: Any, step: int, loss: Any) -> None:
        total = trainer.config.steps
        if not started:
            started.extend((time.perf_counter(), step - 1))
        if step % every and step != total:
            return
        elapsed = time.perf_counter() - started[0]
        left = elapsed / max(step - started[1], 1) * (total - step)
        end = ", done" if step >= total else f", about {left:,.0f} s to go"
        show_line(f"{what}: step {step:,} of {total:,}, loss {float(loss):.3f}, {elapsed:,.0f} s so far{end}", handle)

    return on_step
