"""Draw a model's attention weights on a text as heatmaps: row i is a query token, column j a key token, and the cell is
softmax(Q K^T / sqrt(d_k) + mask)_ij, so every row sums to 1.

By default one PNG grid of all layers (rows) x heads (columns); --layer and/or --head narrow it to some rows and columns
(``--layer 16-18``, ``--head 0,3``) or to one map (a single map also shows the numbers). A translator has three kinds of
attention, each drawn to its own file: the encoder self-attention (source x source), the decoder masked self-attention
(target x target) and the cross-attention (target rows x source columns); the target is --target, or the model's own
greedy translation of TEXT. --html also writes a standalone page (no network needed) with pickers for the kind, layer
and head, where hovering a cell shows its weight.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from qkv.cli.common import add_device_arguments, add_model_argument, model_path, note_unknown, use_device
from qkv.cli.options import add_html_argument, add_picture_out, add_target_argument, html_path, picture_path
from qkv.errors import QkvError
from qkv.loading import load
from qkv.models.family import family_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser)
    add_device_arguments(parser)
    parser.add_argument("text", help="the text to run the model on (a translator's source sentence)")
    add_target_argument(parser)
    parser.add_argument("--part", choices=("encoder", "decoder", "cross"), help="draw only this kind of attention")
    parser.add_argument("--layer", type=numbers, metavar="L", help="draw only this layer, or these: 0,5,10 or 16-18")
    parser.add_argument("--head", type=numbers, metavar="H", help="draw only this head, or these: 0,3 or 2-4")
    add_picture_out(parser, "attention.png", "the PNG to write (a translator's kinds add -encoder, -decoder, -cross)")
    add_html_argument(parser, "the interactive HTML view")
    parser.add_argument("--json", action="store_true", help="print the files written and every weight as JSON")


def numbers(text: str) -> int | list[int]:
    """One number ("3"), or several: a comma list ("0,5,10"), ranges ("16-18") or both ("0,16-18")."""
    found: list[int] = []
    for piece in text.split(","):
        first, dash, last = piece.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise argparse.ArgumentTypeError(f"{text!r} is not a number, a list (0,5,10) or a range (16-18)")
        found += range(int(first), int(last) + 1) if dash else [int(first)]
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} is an empty range: write the smaller number first (16-18)")
    return found[0] if len(found) == 1 and "," not in text and "-" not in text else found


def _path_for(out: Path, part: str, several: bool) -> Path:
    return out.with_name(f"{out.stem}-{part}{out.suffix}") if several else out


def run(args: argparse.Namespace) -> int:
    from qkv.inspect.attention_maps import attention_maps
    from qkv.inspect.figures import draw_attention
    from qkv.inspect.html_view import write_attention_html

    bundle = load(model_path(args), device=use_device(args), dequantize=True)  # the file's numbers, in float32
    family = family_of(bundle.model)
    if args.target is not None and not family.two_vocabularies:
        raise QkvError(f"--target is for translators: {family.title} reads one text")
    note_unknown(bundle.tokenizer, args.text, what="the text")
    if args.target is not None:
        note_unknown(bundle.target_tokenizer or bundle.tokenizer, args.target, what="the target")
    maps = attention_maps(bundle, args.text, target=args.target)
    if args.part is not None and args.part not in maps.groups:
        raise QkvError(f"{family.title} has no {args.part} attention: choose --part from {', '.join(maps.groups)}")
    names = [args.part] if args.part else list(maps.groups)
    for name in names:
        maps.groups[name].select(args.layer, args.head)  # check --layer/--head before drawing anything
    out = picture_path(args.out, args.run_dir, "attention.png")
    where = f" ({bundle.path.name})" if bundle.path else ""
    pictures = []
    for name in names:
        group = maps.groups[name]
        path = _path_for(out, name, len(names) > 1)
        pictures.append(draw_attention(group, path, layer=args.layer, head=args.head, title=group.title + where))
    html = None
    if args.html is not None:
        page = html_path(args, "attention.png")
        html = write_attention_html(maps, page, title=f"Attention maps{where}")
    if args.json:
        written = [{"path": str(p.path), "width": p.width, "height": p.height, "panels": p.panels} for p in pictures]
        print(json.dumps({"pictures": written, "html": str(html) if html else None, **maps.to_dict()}))
        return 0
    print("source: " + " ".join(maps.source_tokens))
    if maps.target_tokens is not None:
        made = " (the model's greedy translation)" if maps.generated else ""
        print(f"target{made}: " + " ".join(maps.target_tokens))
    for picture in pictures:
        maps_drawn = f"{picture.panels} map{'s' if picture.panels != 1 else ''}"
        print(f"wrote {picture.path} ({maps_drawn}, {picture.width}x{picture.height} pixels)")
    if html is not None:
        print(f"wrote {html} (open it in a browser; hover a cell to read its weight)")
    return 0
