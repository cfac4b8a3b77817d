"""Translate sentences with a trained encoder-decoder: from arguments, a file (--file) or standard input,
one sentence per line, one translation per line out. Greedy with --beam 1; beam search otherwise, with a
length penalty and --n-best alternatives (printed as "rank<TAB>score<TAB>translation" lines, a blank
line between sentences)."""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import TYPE_CHECKING, cast

from qkv.cli.common import (
    add_device_arguments,
    add_model_argument,
    add_quantize_argument,
    add_step_argument,
    load_for_use,
    load_options,
    model_path,
    note_unknown,
    use_device,
)
from qkv.cli.options import compile_note, compiled_note, note
from qkv.errors import QkvError
from qkv.io import read_text

if TYPE_CHECKING:
    from qkv.models.rnnsearch.config import RNNSearchConfig
    from qkv.models.transformer.config import TransformerConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser)
    parser.add_argument("sentences", nargs="*", metavar="SENTENCE", help="sentences to translate")
    parser.add_argument("--file", help="translate every line of this file")
    parser.add_argument("--beam", type=int, default=4, help="beam size (1 = greedy; default 4)")
    parser.add_argument("--length-penalty", type=float, default=1.0, help="score = log P / length^penalty (1.0)")
    parser.add_argument("--n-best", type=int, default=1, help="print this many translations per sentence")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences decoded together (32)")
    parser.add_argument("--max-len-a", type=float, default=1.5, help="output length limit: a x source length + b")
    parser.add_argument("--max-len-b", type=int, default=10, help="see --max-len-a")
    add_device_arguments(parser)
    add_quantize_argument(parser)
    add_step_argument(parser)


def read_sentences(args: argparse.Namespace) -> list[str]:
    if args.sentences and args.file:
        raise QkvError("give sentences as arguments or with --file, not both")
    if args.sentences:
        return [line.strip() for line in args.sentences]
    if args.file:
        lines = read_text(args.file, what="input file").split("\n")
    else:
        if sys.stdin.isatty():
            print("reading sentences from standard input (one per line; end with Ctrl-D)", file=sys.stderr)
        lines = sys.stdin.read().split("\n")
    if lines and lines[-1] == "":  # the line break that ends the last line starts no sentence
        lines = lines[:-1]
    if not lines:
        note("standard input held no sentence to translate: give one per line, or as arguments")
    return [line.strip() for line in lines]


def run(args: argparse.Namespace) -> int:
    from qkv.decoding.translator import Translator

    if args.beam < 1 or args.n_best < 1 or args.n_best > args.beam:
        raise QkvError("--beam must be >= 1 and --n-best between 1 and --beam")
    if args.batch_size < 1 or args.max_len_b < 0 or args.max_len_a < 0:
        raise QkvError("--batch-size must be at least 1, and --max-len-a and --max-len-b not negative")
    if args.model and args.run_dir:  # `qkv translate --model X "sentence"`: the first sentence, not a run dir
        args.sentences, args.run_dir = [args.run_dir, *args.sentences], None
    bundle = load_for_use(
        model_path(args),
        expect="translator",
        device=use_device(args),
        **load_options(args),
    )
    translator = Translator.from_bundle(bundle, step=args.step)
    compile_note(args.step)
    sentences = read_sentences(args)
    context = cast("TransformerConfig | RNNSearchConfig", bundle.config).context_length  # a translator's
    longest = context - 1  # the decoder's positions, <bos> first
    if args.max_len_b >= longest:
        note(f"--max-len-b {args.max_len_b} is past the model's {context} positions: each "
             f"translation stops at {longest} tokens at most")  # fmt: skip
    note_unknown(bundle.tokenizer, sentences, what="the sentences")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        results = translator.translate_n_best(
            sentences,
            beam=args.beam,
            n_best=args.n_best,
            length_penalty=args.length_penalty,
            max_len_a=args.max_len_a,
            max_len_b=args.max_len_b,
            batch_size=args.batch_size,
        )
    compiled_note(args.step, bundle.model)
    if translator.empty:
        note(f"{translator.empty} of the {len(sentences)} sentences are empty: each is translated as an empty line")
    if translator.cropped:
        print(
            f"warning: {translator.cropped} sentence(s) were longer than the model's maximum of "
            f"{context} tokens and were cropped",
            file=sys.stderr,
        )
    for number, n_best in enumerate(results):
        if args.n_best == 1:
            print(n_best[0][0])
            continue
        if number:
            print()  # a blank line between the alternatives of consecutive sentences
        for rank, (text, score) in enumerate(n_best, 1):
            print(f"{rank}\t{score:.4f}\t{text}")
    return 0
