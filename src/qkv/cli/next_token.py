"""Show the model's next-token distribution after a prompt: the top tokens with their logits and their
probabilities softmax(logits / T) at several temperatures side by side, as a table and as a bar chart.

The order of the tokens is the same at every temperature (dividing by T keeps the order of the logits);
a low T piles the probability onto the likeliest tokens, a high T spreads it out, and T = 0 is greedy.
--top-k and --top-p cut the tail as sampling does: the numbers are the distribution `qkv generate` and the
playground sample from. For a translator, TEXT is the source sentence and --target the start of the
translation; the distribution is over the next target token.
"""

from __future__ import annotations

import argparse
import json

from qkv.cli.common import add_device_arguments, add_model_argument, model_path, note_unknown, use_device
from qkv.cli.options import add_alias, add_picture_out, add_target_argument, add_top_argument, note, picture_path
from qkv.errors import QkvError
from qkv.loading import load
from qkv.models.family import family_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser)
    add_device_arguments(parser)
    parser.add_argument("text", help="the prompt (a translator's source sentence)")
    add_target_argument(parser, what="a translator's target prefix (default: none, just <bos>)", default="")
    add_top_argument(parser, default=10, what="how many tokens to show")
    parser.add_argument(
        "--temperatures", type=float, nargs="+", default=[0.5, 1.0, 2.0],
        help="temperatures T (default 0.5 1 2; 0 is greedy)",
    )  # fmt: skip
    parser.add_argument("--top-k", type=int, help="keep only the k likeliest tokens, as sampling would (default: all)")
    parser.add_argument(
        "--top-p", type=float, help="keep the fewest likeliest tokens whose probabilities reach p (default: all)"
    )
    add_picture_out(parser, "next-token.png", "the bar chart to write")
    add_alias(parser, "--plot", of="--out", dest="out")
    parser.add_argument("--no-plot", action="store_true", help="do not draw the bar chart")
    parser.add_argument("--digits", type=int, default=4, help="decimals shown (default 4)")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")


def run(args: argparse.Namespace) -> int:
    from qkv.inspect.figures import draw_next_token
    from qkv.inspect.next_token import next_token, next_token_table

    if args.digits < 0:
        raise QkvError("--digits must be >= 0")
    bundle = load(model_path(args), device=use_device(args), dequantize=True)  # the file's numbers, in float32
    family = family_of(bundle.model)
    if args.target and not family.two_vocabularies:
        raise QkvError(f"--target is for translators: {family.title} continues the prompt itself")
    note_unknown(bundle.tokenizer, args.text, what="the text")
    if not args.text.strip() and not family.two_vocabularies:
        note("the text is empty: this is the distribution of the first token, after <bos>")
    result = next_token(
        bundle,
        args.text,
        temperatures=args.temperatures,
        top=args.top,
        target_prefix=args.target,
        top_k=args.top_k,
        top_p=args.top_p,
    )
    picture = None
    if not args.no_plot:
        context = "".join(result.context_tokens)
        title = f"P(next token | {context[-40:]!r}) = softmax(logits / T)"
        out = picture_path(args.out, args.run_dir, "next-token.png")
        picture = draw_next_token(result.top_tokens, result.top_probabilities, result.temperatures, out, title=title)
    if args.json:
        data = result.to_dict()
        data["plot"] = str(picture.path) if picture else None
        print(json.dumps(data, ensure_ascii=False))
        return 0
    from rich.console import Console
    from rich.text import Text

    console = Console()
    if result.cropped:
        console.print(Text(f"note: the first {result.cropped} tokens do not fit the model's context; "
                           "it reads the last ones, as generation does", style="yellow"))  # fmt: skip
    console.print(Text("context: " + " ".join(result.context_tokens)))
    filters = [f"top-k {result.top_k}"] if result.top_k else []
    if result.top_p:
        filters.append(f"top-p {result.top_p:g}")
    if filters:
        console.print(Text(f"filtered as sampling does: {', '.join(filters)}", style="dim"))
    console.print(next_token_table(result, digits=args.digits))
    entropy = ", ".join(f"T={t:g}: {h:.3f}" for t, h in zip(result.temperatures, result.entropy(), strict=True))
    console.print(Text(f"entropy (nats; higher is flatter): {entropy}", style="dim"))
    if picture is not None:
        console.print(Text(f"wrote {picture.path} ({picture.panels} charts, {picture.width}x{picture.height} pixels)"))
    return 0
