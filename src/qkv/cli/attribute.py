"""Direct logit attribution: how much the embedding, each block's attention and MLP, and each head push the
logit of one next token up or down, at one position (--position, default the last).

The final LayerNorm is linearised as TransformerLens does (its scale sigma computed on the whole stream), so
the parts sum exactly to the model's logit; the line "bias" is what the norm's bias and W_U's bias add.
--token picks the token (default: the model's top prediction); with --foil the parts explain
logit(token) - logit(foil). Needs a pre-LN model (a GPT, GPT-2, a pre-LN translator): a post-LN model
renormalises the stream in every block. A translator's TEXT is the source sentence and --target the
target written so far (--prefix, the old name, still works).
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
    parser.add_argument("text", help="the text (a translator's source sentence)")
    parser.add_argument("--token", metavar="TOKEN", help="the token whose logit is explained (default: the top one)")
    parser.add_argument("--foil", metavar="TOKEN", help="explain logit(token) - logit(foil) instead")
    parser.add_argument("--position", default="-1", help="the position predicting it: index or token (default -1)")
    add_target_argument(parser, what="a translator's target prefix (default: none, just <bos>)", default="",
                        old="--prefix")  # fmt: skip
    parser.add_argument("--layer", type=int, help="list every head of this block instead of the top ones")
    add_top_argument(parser, default=8, what="heads listed, largest |contribution| first")
    add_picture_out(parser, "attribution.png", "the chart to write")
    parser.add_argument("--no-plot", action="store_true", help="do not draw the chart")
    parser.add_argument("--json", action="store_true", help="print every number as JSON")


def _heads_table(result, layer: int | None, top: int):
    from rich.table import Table

    table = Table(header_style="bold cyan", show_edge=False, pad_edge=False)
    table.add_column("head")
    table.add_column("contribution", justify="right")
    kinds = [("", False)] + ([("cross ", True)] if result.cross_heads is not None else [])
    for name, cross in kinds:
        heads = result.cross_heads if cross else result.heads
        if layer is None:
            chosen = result.top_heads(top, cross=cross)
        else:
            chosen = [(layer, h, float(heads[layer, h])) for h in range(heads.shape[1])]
        for i, h, value in chosen:
            table.add_row(f"{name}block {i} head {h}", f"{value:+.4f}")
    return table


def run(args: argparse.Namespace) -> int:
    from qkv.inspect.attribution import attribute
    from qkv.inspect.circuit_figures import draw_attribution
    from qkv.inspect.trace import check_range

    check_top(args.top)
    bundle = load(model_path(args), device=use_device(args), dequantize=True)  # the file's numbers, in float32
    check_answer_tokens(bundle, args.target, args.token, args.foil)
    result = attribute(bundle, args.text, target=args.token, foil=args.foil, position=args.position,
                       prefix=args.target)  # fmt: skip
    check_range("decoder", result.n_layers, result.heads.shape[1], args.layer, None)
    picture = None
    if not args.no_plot:
        picture = draw_attribution(result, picture_path(args.out, args.run_dir, "attribution.png"))
    if args.json:
        print(json.dumps({**result.to_dict(), "plot": str(picture.path) if picture else None}, ensure_ascii=False))
        return 0
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    console.print(Text("tokens: " + " ".join(result.tokens)))
    what = f"logit({result.target_token!r})"
    if result.foil_token is not None:
        what += f" - logit({result.foil_token!r})"
    token = result.tokens[result.position]
    console.print(Text(f"{what} after {token!r} (position {result.position}) = {result.logit:.4f}"))
    table = Table(header_style="bold cyan", show_edge=False, pad_edge=False)
    table.add_column("part")
    table.add_column("contribution", justify="right")
    for label, value in result.terms():
        table.add_row(label, f"{value:+.4f}")
    table.add_row(Text("sum of the parts", style="bold"), f"{result.total():+.4f}")
    console.print(table)
    which = f"every head of block {args.layer}" if args.layer is not None else "the heads that push most"
    console.print(Text(f"{which} (final-norm scale sigma = {result.scale:.4f}):", style="dim"))
    console.print(_heads_table(result, args.layer, args.top))
    if picture is not None:
        console.print(Text(f"wrote {picture.path} ({picture.width}x{picture.height} pixels)"))
    return 0
