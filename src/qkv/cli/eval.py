"""Measure a trained model: on a text, loss (nats per token), perplexity, bits per token and per character (language
models); on a test set, sacrebleu BLEU and chrF with their signatures (translators, ``--src FILE --ref FILE``)."""

from __future__ import annotations

import argparse
import json
from typing import cast

from qkv.cli.common import (
    add_device_arguments,
    add_model_argument,
    add_quantize_argument,
    check_role,
    load_for_use,
    load_options,
    model_path,
    note_unknown,
    use_device,
)
from qkv.errors import QkvError
from qkv.io import read_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser)
    parser.add_argument("file", metavar="FILE", nargs="?", help="text file to score (language models)")
    parser.add_argument("--src", help="source sentences, one per line (translators)")
    parser.add_argument("--ref", help="reference translations, one per line (translators)")
    parser.add_argument("--beam", type=int, default=4, help="beam size for translators (default 4)")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    add_device_arguments(parser)
    add_quantize_argument(parser)


def run(args: argparse.Namespace) -> int:
    if args.model and args.run_dir and not args.file:  # `qkv eval --model X FILE`
        args.file, args.run_dir = args.run_dir, None
    if args.src or args.ref:
        return evaluate_translator_from_cli(args)
    from qkv.loading import load
    from qkv.models.family import TRANSLATOR, family_of
    from qkv.models.gpt import GPT
    from qkv.training.perplexity import score_text

    path = model_path(args)
    if not args.file:
        if family_of(load(path).model).role == TRANSLATOR:
            raise QkvError(
                f"{path} is a translator: give a test set with --src SOURCES --ref REFERENCES (one sentence per "
                "line) for BLEU and chrF"
            )
        raise QkvError("give a text FILE to evaluate on: qkv eval RUN_DIR FILE")
    bundle = load(path, device=use_device(args), **load_options(args))
    if family_of(bundle.model).role == TRANSLATOR:
        raise QkvError(
            f"{path} is a translator: it scores a test set, not a text file: qkv eval {path} --src SOURCES --ref "
            "REFERENCES"
        )
    bundle = check_role(bundle, path, expect="language model")
    text = read_text(args.file)
    note_unknown(bundle.tokenizer, text, what=args.file)
    score = score_text(cast(GPT, bundle.model), bundle.tokenizer, text)  # check_role: a language model
    if args.json:
        print(json.dumps(score.as_dict()))
    else:
        print(f"tokens          {score.tokens:,}")
        print(f"loss            {score.loss:.4f} nats/token")
        print(f"perplexity      {score.perplexity:.3f}")
        print(f"bits per token  {score.bits_per_token:.4f}")
        print(f"bits per char   {score.bits_per_char:.4f}")
    return 0


def _lines(path: str, what: str) -> list[str]:
    text = read_text(path, what=what)
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def evaluate_translator_from_cli(args: argparse.Namespace) -> int:
    from qkv.decoding.translator import Translator

    if not (args.src and args.ref):
        raise QkvError("give both --src (source sentences) and --ref (reference translations)")
    bundle = load_for_use(
        model_path(args),
        expect="translator",
        device=use_device(args),
        **load_options(args),
    )
    translator = Translator.from_bundle(bundle)
    sources, references = _lines(args.src, "source file"), _lines(args.ref, "reference file")
    if len(sources) != len(references):
        raise QkvError(
            f"{args.src} has {len(sources)} lines but {args.ref} has {len(references)}: the files must be line-aligned"
        )
    scores = translator.score(sources, references, beam=args.beam)
    if args.json:
        print(json.dumps(scores.as_dict()))
    else:
        print(scores.bleu_text)
        print(f"BLEU  {scores.bleu:.2f}   {scores.bleu_signature}")
        print(f"chrF  {scores.chrf:.2f}   {scores.chrf_signature}")
    return 0
