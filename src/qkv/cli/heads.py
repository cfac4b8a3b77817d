"""Find the heads that attend to the previous token, to the first token (the attention sink), to the token
after the previous occurrence of the current one (induction heads) or to that occurrence itself
(duplicate-token heads).

The model reads --batch sequences of --length random tokens, each repeated twice; a head's score is its
mean attention weight on the position the behaviour predicts (previous-token: i-1; first-token: 0;
induction: i-L+1 in the second copy; duplicate-token: i-L), so it lies in [0, 1]. The table lists the top
heads per score; --layer/--head show one layer's or one head's scores. A translator's encoder and decoder
self-attention are both scored.
"""

from __future__ import annotations

import argparse
import json

from qkv.cli.common import add_device_arguments, add_model_argument, check_top, model_path, use_device
from qkv.cli.options import add_picture_out, add_seed_argument, add_top_argument, picture_path
from qkv.loading import load


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser)
    add_device_arguments(parser)
    parser.add_argument("--length", type=int, help="random tokens per sequence, repeated twice (default 50 or less)")
    parser.add_argument("--batch", type=int, default=8, help="random sequences averaged over (default 8)")
    add_seed_argument(parser, what="seed of the random tokens")
    parser.add_argument("--bos", action="store_true", help="put the <bos> token first (TransformerLens does for GPT-2)")
    parser.add_argument("--part", choices=("encoder", "decoder"), help="a translator's self-attention to list")
    parser.add_argument("--layer", type=int, help="show every head of this layer")
    parser.add_argument("--head", type=int, help="show this head (of every layer, or of --layer)")
    add_top_argument(parser, default=5, what="heads listed per score")
    add_picture_out(parser, "heads.png", "the heatmaps to write")
    parser.add_argument("--no-plot", action="store_true", help="do not draw the heatmaps")
    parser.add_argument("--json", action="store_true", help="print every score as JSON")


def _top_table(part, top: int):
    from rich.table import Table

    table = Table(title=part.title, header_style="bold cyan", show_edge=False, pad_edge=False, title_justify="left")
    table.add_column("#", justify="right")
    for name in part.scores:
        table.add_column(name, no_wrap=True)
    columns = [part.top(name, top) for name in part.scores]
    for rank in range(min(top, part.n_layers * part.n_heads)):
        table.add_row(str(rank + 1), *[f"{c[rank][0]}.{c[rank][1]}  {c[rank][2]:.3f}" for c in columns])
    return table


def _heads_table(part, layer: int | None, head: int | None):
    from rich.table import Table

    table = Table(title=part.title, header_style="bold cyan", show_edge=False, pad_edge=False, title_justify="left")
    table.add_column("head")
    for name in part.scores:
        table.add_column(name, justify="right")
    layers = range(part.n_layers) if layer is None else [layer]
    heads = range(part.n_heads) if head is None else [head]
    for i in layers:
        for h in heads:
            table.add_row(f"{i}.{h}", *[f"{values[i, h]:.3f}" for values in part.scores.values()])
    return table


def _fits(part, layer: int | None, head: int | None) -> bool:
    return (layer is None or 0 <= layer < part.n_layers) and (head is None or 0 <= head < part.n_heads)


def run(args: argparse.Namespace) -> int:
    from qkv.inspect.circuit_figures import draw_head_scores
    from qkv.inspect.heads import detect_heads

    check_top(args.top)
    bundle = load(model_path(args), device=use_device(args), dequantize=True)  # the file's numbers, in float32
    detection = detect_heads(bundle, length=args.length, batch=args.batch, seed=args.seed, bos=args.bos)
    parts = [detection.part(args.part)] if args.part else detection.parts
    fitting = [p for p in parts if _fits(p, args.layer, args.head)]
    if not fitting:  # say what exists in the first kind of attention
        detection.check(args.layer, args.head, parts[0].part)
    parts = fitting
    picture = None if args.no_plot else draw_head_scores(detection, picture_path(args.out, args.run_dir, "heads.png"))
    if args.json:
        data = detection.to_dict(top=args.top)
        print(json.dumps({**data, "plot": str(picture.path) if picture else None}, ensure_ascii=False))
        return 0
    from rich.console import Console
    from rich.text import Text

    console = Console()
    console.print(Text(f"{detection.batch} random sequences of {detection.length} tokens, each repeated twice",
                       style="dim"))  # fmt: skip
    console.print(Text("score = mean attention weight on the position; heads as layer.head", style="dim"))
    for part in parts:
        if args.layer is None and args.head is None:
            console.print(_top_table(part, args.top))
        else:
            console.print(_heads_table(part, args.layer, args.head))
    if picture is not None:
        console.print(Text(f"wrote {picture.path} ({picture.panels} maps, {picture.width}x{picture.height} pixels)"))
    return 0
