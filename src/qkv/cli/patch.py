"""Activation patching: run a clean and a corrupted prompt of the same token length, then rerun the corrupted
one with a single activation taken from the clean run (the residual stream after each layer at each
position, or one head's output), and measure how much of the logit difference logit(target) - logit(foil)
at the last position comes back: 0 = as corrupt, 1 = as clean.

--token (the clean answer) defaults to the clean run's top prediction and --foil to the corrupt run's. The
heatmaps show every site; the table lists the sites that recover most. A translator's --clean/--corrupt are
source sentences, and --target the target written so far (its encoder, decoder and cross-attention are
patched; --prefix, the old name, still works).
"""

from __future__ import annotations

import argparse
import json

from qkv.cli.common import (
    add_device_arguments,
    add_model_argument,
    check_answer_tokens,
    check_top,
    model_path,
    use_device,
)
from qkv.cli.options import add_picture_out, add_target_argument, add_top_argument, picture_path
from qkv.loading import load


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser)
    add_device_arguments(parser)
    parser.add_argument("--clean", required=True, help="the prompt whose answer is the target")
    parser.add_argument("--corrupt", required=True, help="a prompt of the same token length with another answer")
    parser.add_argument("--token", metavar="TOKEN", help="the clean answer (default: the clean run's top token)")
    parser.add_argument("--foil", metavar="TOKEN", help="the corrupt answer (default: the corrupt run's top token)")
    add_target_argument(parser, what="a translator's target prefix (default: none, just <bos>)", default="",
                        old="--prefix")  # fmt: skip
    add_top_argument(parser, default=5, what="sites listed per map")
    add_picture_out(parser, "patch.png", "the heatmaps to write")
    parser.add_argument("--no-plot", action="store_true", help="do not draw the heatmaps")
    parser.add_argument("--json", action="store_true", help="print every number as JSON")


def _progress():
    """A transient progress bar on stderr when it is a terminal; None otherwise."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        return None, None
    bar = Progress(TextColumn("[bold]patching"), BarColumn(), MofNCompleteColumn(), console=console, transient=True)
    task = bar.add_task("patch", total=None)
    return bar, lambda done, total: bar.update(task, completed=done, total=total)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from qkv.inspect.circuit_figures import draw_patching
    from qkv.inspect.patching import patch

    check_top(args.top)
    bundle = load(model_path(args), device=use_device(args), dequantize=True)  # the file's numbers, in float32
    check_answer_tokens(bundle, args.target, args.token, args.foil)
    bar, update = _progress()
    if bar is not None:
        bar.start()
    try:
        result = patch(bundle, args.clean, args.corrupt, target=args.token, foil=args.foil, prefix=args.target,
                       progress=update)  # fmt: skip
    finally:
        if bar is not None:
            bar.stop()
    picture = None if args.no_plot else draw_patching(result, picture_path(args.out, args.run_dir, "patch.png"))
    if args.json:
        print(json.dumps({**result.to_dict(), "plot": str(picture.path) if picture else None}, ensure_ascii=False))
        return 0
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    console.print(Text("clean:   " + " ".join(result.clean_tokens)))
    console.print(Text("corrupt: " + " ".join(result.corrupt_tokens)))
    what = f"logit({result.target_token!r}) - logit({result.foil_token!r})"
    console.print(Text(f"{what}: clean {result.clean_difference:+.4f}, corrupt {result.corrupt_difference:+.4f}"))
    for m in result.maps:
        table = Table(title=m.title, header_style="bold cyan", show_edge=False, pad_edge=False, title_justify="left")
        table.add_column("layer")
        table.add_column(m.column_axis)
        table.add_column("recovered", justify="right")
        order = np.argsort(-m.values, axis=None, kind="stable")[: args.top]
        for flat in order:
            r, c = divmod(int(flat), m.values.shape[1])
            column = f"{c} {m.columns[c]!r}" if m.column_axis == "position" else m.columns[c]
            table.add_row(m.rows[r], column, f"{m.values[r, c]:.3f}")
        console.print(table)
    if picture is not None:
        console.print(Text(f"wrote {picture.path} ({picture.panels} maps, {picture.width}x{picture.height} pixels)"))
    return 0
