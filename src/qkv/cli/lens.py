"""The logit lens: read the residual stream after the embedding and after every block through the model's
final norm and W_U, as if the remaining blocks were not there, and show what each layer would predict.

The table shows, at one position (--position, default the last), every layer's top tokens with their
probabilities and the probability and rank of the model's final prediction; with --layer it shows one
block's top tokens at every position instead. The heatmap has a row per layer (embedding at the bottom) and
a column per position, coloured by the probability of the final prediction (--color top: of the row's own
top token), with each row's top token written in. In a post-LN model (the paper's translators, Marian) every
block already ends in a LayerNorm, so W_U reads each block's output directly. A translator's TEXT is the
source sentence; the lens reads its decoder on --target (default: its own greedy translation).

--html [FILE] also writes the playground's walk-through of a language model on TEXT as one standalone page (no network
needed): tokens and ids, the token and position vectors, every block's attention (head picker), residual
norm and logit lens, then the unembedding with live temperature, top-k and top-p. Click a cell for its numbers.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from qkv.cli.common import add_device_arguments, add_model_argument, model_path, note_unknown, use_device
from qkv.cli.options import (
    add_html_argument,
    add_picture_out,
    add_target_argument,
    add_top_argument,
    html_path,
    picture_path,
)
from qkv.errors import QkvError
from qkv.loading import load
from qkv.models.family import LANGUAGE_MODEL, family_of

if TYPE_CHECKING:
    from qkv.inspect.figures import Picture
    from qkv.inspect.lens import LogitLens
    from qkv.model_dir import ModelBundle


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser)
    add_device_arguments(parser)
    parser.add_argument("text", help="the text (a translator's source sentence)")
    add_target_argument(parser)
    parser.add_argument("--position", default="-1", help="the position the table shows: index or token (default -1)")
    parser.add_argument("--layer", type=int, help="show block LAYER's top tokens at every position instead")
    add_top_argument(parser, default=3, what="top tokens per layer and position")
    parser.add_argument("--color", choices=("final", "top"), default="final",
                        help="colour by P(final prediction) (default) or P(the row's own top token)")  # fmt: skip
    add_picture_out(parser, "lens.png", "the heatmap to write")
    parser.add_argument("--no-plot", action="store_true", help="do not draw the heatmap")
    add_html_argument(parser, "the walk-through of the whole forward pass (language models) as one standalone page")
    parser.add_argument("--json", action="store_true", help="print every number as JSON")


def _cell(token: str, p: float) -> str:
    return f"{token!r} {100 * p:.1f}%"


def lens_table(lens, position: int | None, layer: int | None):
    """A rich table: rows = layers at one position, or positions at one layer (``layer`` = block index)."""
    from rich.table import Table

    table = Table(header_style="bold cyan", show_edge=False, pad_edge=False)
    k = lens.top_probs.shape[-1]
    if layer is None:
        table.add_column("read after", no_wrap=True)
        rows = [(lens.rows[r], r, position) for r in range(lens.n_rows)]
    else:
        table.add_column("position", no_wrap=True)
        rows = [(f"{t} {lens.tokens[t]!r}", layer + 1, t) for t in range(len(lens.tokens))]
    for rank in range(k):
        table.add_column(("1st", "2nd", "3rd")[rank] if rank < 3 else f"{rank + 1}th", no_wrap=True,
                         overflow="ellipsis", max_width=16)  # fmt: skip
    table.add_column("final" if layer is not None else f"{lens.final_tokens[position]!r}", justify="right",
                     no_wrap=True)  # fmt: skip
    for label, r, t in rows:
        cells = [_cell(lens.top_tokens[r][t][i], lens.top_probs[r, t, i]) for i in range(k)]
        final = f"{100 * lens.final_probs[r, t]:.1f}% #{lens.final_ranks[r, t] + 1}"
        table.add_row(label, *cells, final)
    return table


LEGIBLE_COLUMNS = 40  # the heatmap writes every cell's token up to this many positions


def legible_window(lens, position: int):
    """The lens cut to at most LEGIBLE_COLUMNS positions ending at ``position`` (or starting at 0), so every cell
    of the heatmap keeps its token at any text length; and the title's note of which positions it shows."""
    n = len(lens.tokens)
    if n <= LEGIBLE_COLUMNS:
        return lens, ""
    end = max(position + 1, LEGIBLE_COLUMNS)
    cut = slice(end - LEGIBLE_COLUMNS, end)
    shown = replace(
        lens, tokens=lens.tokens[cut], top_ids=lens.top_ids[:, cut], top_probs=lens.top_probs[:, cut],
        top_tokens=[row[cut] for row in lens.top_tokens], final_ids=lens.final_ids[cut],
        final_tokens=lens.final_tokens[cut], final_probs=lens.final_probs[:, cut], final_ranks=lens.final_ranks[:, cut],
    )  # fmt: skip
    return shown, f", positions {cut.start}-{cut.stop - 1} of {n}"


def run(args: argparse.Namespace) -> int:
    from qkv.inspect.lens import logit_lens
    from qkv.inspect.tokens import find_position
    from qkv.inspect.trace import check_range

    bundle = load(model_path(args), device=use_device(args), dequantize=True)  # the file's numbers, in float32
    family = family_of(bundle.model)
    if args.target is not None and not family.two_vocabularies:
        raise QkvError(f"--target is for translators: {family.title} reads one text")
    if args.html is not None:  # before the lens runs; the same line as the walk-through itself and the server
        family.require_role(LANGUAGE_MODEL, "the walk-through")
    lens = logit_lens(bundle, args.text, target=args.target, top=args.top)  # refuses a family without a stream
    note_unknown(bundle.tokenizer, args.text, what="the text")
    if args.target is not None:
        note_unknown(bundle.target_tokenizer or bundle.tokenizer, args.target, what="the target")
    check_range("decoder", lens.n_rows - 1, 1, args.layer, None)
    position = find_position(lens.tokens, args.position, what="--position")
    page = _walkthrough_page(args, bundle) if args.html is not None else None
    picture = None if args.no_plot else _lens_picture(args, bundle, lens, position)
    if args.json:
        plot = str(picture.path) if picture else None
        print(json.dumps({**lens.to_dict(), "plot": plot, "html": str(page) if page else None}, ensure_ascii=False))
        return 0
    _print_lens(args, lens, position, picture, page)
    return 0


def _walkthrough_page(args: argparse.Namespace, bundle: ModelBundle) -> Path:
    """Write the walk-through of the text (--html) as one HTML page; its path."""
    from qkv.inspect.walkthrough import walkthrough
    from qkv.inspect.walkthrough_html import write_walkthrough_html

    name = f" ({bundle.path.name})" if bundle.path else ""
    walk = walkthrough(bundle, args.text, top=args.top, vocab=True)
    return write_walkthrough_html(walk, html_path(args, "lens.png"), title=f"Walk-through{name}")


def _lens_picture(args: argparse.Namespace, bundle: ModelBundle, lens: LogitLens, position: int) -> Picture:
    """Draw the lens's heatmap (the legible window ending at ``position``), coloured as --color says."""
    from qkv.inspect.circuit_figures import draw_logit_lens

    where = f" ({bundle.path.name})" if bundle.path else ""
    what = "P(final prediction)" if args.color == "final" else "P(top token)"
    out = picture_path(args.out, args.run_dir, "lens.png")
    shown, span = legible_window(lens, position)
    title = f"logit lens{where}{span}: colour = {what}"
    return draw_logit_lens(shown, out, color=args.color, title=title)


def _print_lens(
    args: argparse.Namespace, lens: LogitLens, position: int, picture: Picture | None, page: Path | None
) -> None:
    """The lens as text: the tokens read, what each cell is, the table, and the files written."""
    from rich.console import Console
    from rich.text import Text

    console = Console()
    if lens.source_tokens is not None:
        console.print(Text("source: " + " ".join(lens.source_tokens)))
        made = " (its greedy translation)" if lens.generated else ""
        console.print(Text(f"decoder input{made}: " + " ".join(lens.tokens)))
    else:
        console.print(Text("tokens: " + " ".join(lens.tokens)))
    if args.layer is None:
        head = f"at position {position} ({lens.tokens[position]!r}), every layer"
    else:
        head = f"after block {args.layer}, every position"
    console.print(Text(f"logit lens {head}", style="dim"))
    console.print(Text(f"read through: {lens.norm}, then W_U", style="dim"))
    console.print(Text("last column: P and rank of the model's final prediction", style="dim"))
    console.print(lens_table(lens, position, args.layer))
    if picture is not None:
        console.print(Text(f"wrote {picture.path} ({picture.width}x{picture.height} pixels)"))
    if page is not None:
        console.print(Text(f"wrote {page} (the walk-through: open it in a browser)"))
