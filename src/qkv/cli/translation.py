"""`qkv eval RUN_DIR --src FILE --ref FILE` for translators: sacrebleu BLEU and chrF with signatures."""

from __future__ import annotations

import argparse
import json

from qkv.cli.common import load_for_use, model_path
from qkv.errors import QkvError
from qkv.io import read_text


def _lines(path: str, what: str) -> list[str]:
    text = read_text(path, what=what)
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def evaluate_translator_from_cli(args: argparse.Namespace) -> int:
    from qkv.decoding.translator import Translator

    if not (args.src and args.ref):
        raise QkvError("give both --src (source sentences) and --ref (reference translations)")
    translator = Translator.from_bundle(load_for_use(model_path(args), expect="transformer", device=args.device))
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
