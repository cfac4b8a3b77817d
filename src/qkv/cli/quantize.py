"""Save a copy of a model with int8 or int4 weights. --bits 8 (the default): every linear layer and the
unembedding quantized to int8 with one scale per 32 weights of a row (GGUF's Q8_0) where every layer's input width
is a multiple of 32, else one scale per output channel (--group-size G chooses). --bits 4: the linear layers to
int4 in groups of --group-size weights with a scale and a minimum each (the unembedding int8). Weight-only by
default: the activations stay float (--activations int8 quantizes each input vector too: W8A8, W4A8). The copy is
an ordinary model folder plus quantization.json: generate, translate, embed, eval and serve load it without the
original, with about a quarter (int8) or a sixth (int4) of the weight memory. The original is left as it is. A .gguf
file's blocks are read as float32 numbers and quantized from those."""

from __future__ import annotations

import argparse
import sys

from qkv.cli.common import add_device_arguments, add_model_argument, model_path, note_unknown, use_device
from qkv.cli.options import add_alias, note
from qkv.errors import QkvError
from qkv.loading import load
from qkv.quantization.activation_modes import MODE_NOTES
from qkv.quantization.int8_linear import ACTIVATIONS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser, what="the model to quantize: a run directory (or --model for a pretrained one)")
    add_device_arguments(parser, default="cpu", why="; a GPU makes --calibrate faster")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for the quantized copy (new or empty)")
    parser.add_argument(
        "--bits",
        type=_bits,
        default=8,
        help="8 (default): int8, a scale per 32 weights (or per --group-size weights); 4: int4, groups of "
        "--group-size weights with a scale and a minimum each (the unembedding stays int8)",
    )
    parser.add_argument(
        "--group-size",
        type=int,
        default=None,
        metavar="G",
        help="weights per scale along each row. --bits 4: 32 (default, GGUF's Q4 block), 64, 128 or 256. --bits 8: "
        "a multiple of 32 for a scale per group (default 32, GGUF's Q8_0, where every layer's input width is a "
        "multiple of 32), or 0 for one scale per output row (the default for other widths; less memory, more "
        "rounding error). It must divide every layer's input width",
    )
    add_alias(parser, "--scheme", of="--bits", dest="bits", type=_bits)  # the older spelling: int8 or int4
    parser.add_argument(
        "--calibrate",
        metavar="FILE",
        help="sample text (running text for a GPT, one sentence per line for an encoder; a few hundred lines "
        "suffice) on which to choose the roundings that minimise each layer's output error (GPTQ, for 8 and "
        "4 bits); default: round each weight to nearest",
    )
    parser.add_argument(
        "--activations",
        choices=ACTIVATIONS,
        default="float",
        help="float (default): weight-only, the inputs stay float; int8: each input vector of an int8 or int4 layer "
        "is quantized too and the sums run in int8 (W8A8, W4A8: CTranslate2's and llama.cpp's arithmetic; faster "
        "decoding on x86 CPUs, a little more rounding), the inputs of W_2 and W_U rounded twice; int8x2: every "
        "input rounded twice, the first rounding's error rounded again (nearly weight-only's answers, twice the "
        "integer products). Saved in the folder",
    )
    parser.add_argument(
        "--smooth",
        choices=("on", "off"),
        help="with --activations int8 over int8 weights: on (default) first moves each layer's large input channels "
        "into its weights (SmoothQuant; the ranges read on --calibrate's text, else on a page of Python's "
        "documentation), which keeps more of the float model's answers; off rounds the inputs as they are",
    )


NOT_SMOOTHED = {
    "float": "these inputs stay float",
    "int8x2": "int8x2 rounds each input twice, which leaves nothing to gain",
    "int4": "int4's 16 levels cannot take the inputs' range",
}
"""Why a model quantized this way is not smoothed (docs/generation.md, "Smoothing the inputs first")."""


def _bits(text: str) -> int | str:
    """--bits 8 or 4; the older --scheme int8 / int4 means the same (anything else is refused in run, one line)."""
    number = text.strip().lower().removeprefix("int")
    return int(number) if number.isdigit() else text


def _progress():
    """A transient progress bar on stderr when it is a terminal (smoothing, calibrating, rounding: GPTQ on a large
    model takes minutes), and the callback that moves it; (None, None) otherwise."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        return None, None
    columns = (TextColumn("[bold]{task.description:<11}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    bar = Progress(*columns, console=console, transient=True)
    task = bar.add_task("quantizing", total=None)
    bar.start()

    def update(what: str, done: int, total: int) -> None:
        bar.update(task, description=what, completed=done, total=total)

    return bar, update


def run(args: argparse.Namespace) -> int:
    from qkv.io import read_text
    from qkv.quantization import weight_bytes
    from qkv.quantization.format import quantization_info
    from qkv.quantization.model import group_sizes, scheme_for_bits
    from qkv.quantization.save import save_quantized

    if isinstance(args.bits, str):
        raise QkvError(f"{args.bits!r} is not a quantization scheme: use --bits 8 (int8) or --bits 4 (int4)")
    scheme = scheme_for_bits(args.bits)
    group_sizes(scheme, args.group_size)  # the value itself, before loading the model
    calibration_text = None if args.calibrate is None else read_text(args.calibrate, what="calibration text")
    bundle = load(model_path(args), device=use_device(args), dequantize=True)  # a GGUF: its numbers, requantized
    note_unknown(bundle.tokenizer, calibration_text or "", what="the calibration text")
    before = weight_bytes(bundle.model)
    bar, progress = _progress()
    try:
        out = save_quantized(
            bundle,
            args.out,
            scheme,
            calibration_text=calibration_text,
            activations=args.activations,
            group_size=args.group_size,
            smooth=args.smooth != "off",
            progress=progress,
        )
    finally:
        if bar is not None:
            bar.stop()
    if args.smooth is not None and not args.activations == scheme == "int8":
        note(
            f"--smooth {args.smooth} had no effect: smoothing comes before int8 activations over int8 weights "
            f"(--bits 8 --activations int8), and {NOT_SMOOTHED[args.activations if scheme == 'int8' else 'int4']}"
        )
    after = weight_bytes(bundle.model)
    info = quantization_info(bundle.model) or {}
    size, smoothed = info.get("int8_group_size", 0), info.get("smoothed_inputs", 0)
    groups = "" if scheme != "int8" else f" in groups of {size}" if size else " with a scale per row"
    print(
        f"qkv quantize: wrote {out} ({scheme} weights{groups}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB, "
        f"{before / after:.1f}x smaller{MODE_NOTES[args.activations]}"
        f"{f', {smoothed} inputs smoothed' if smoothed else ''})",
        file=sys.stderr,
    )
    return 0
