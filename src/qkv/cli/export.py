"""Export a model to ONNX, to run it with ONNX Runtime or another ONNX engine without PyTorch.

A GPT becomes one file whose inputs and outputs include the KV cache (past_key_i / past_value_i in,
present_key_i / present_value_i out); an encoder one file with token vectors and sentence embeddings out; an
encoder-decoder two files, NAME.encoder.onnx (run once per sentence) and NAME.decoder.onnx (run once per
token). docs/deploy.md describes the inputs and outputs and shows the loop that generates with them.
"""

from __future__ import annotations

import argparse
import sys

from qkv.cli.common import add_device_arguments, add_model_argument, model_path, use_device
from qkv.cli.options import add_alias
from qkv.errors import QkvError
from qkv.loading import load
from qkv.models.family import ENCODER, family_of

HELP = "export a model to ONNX (GPT with its KV cache, encoder, encoder-decoder)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser, what="the model to export: a run directory (or --model for a pretrained one)")
    add_device_arguments(parser, default="cpu", why="; the graph is traced on the CPU whatever the device")
    parser.add_argument(
        "--out", metavar="FILE.onnx",
        help="write the ONNX graph(s) here (a name ending in .onnx; a translator's two files add .encoder, .decoder)",
    )  # fmt: skip
    add_alias(parser, "--onnx", of="--out", dest="out")
    parser.add_argument("--force", action="store_true", help="replace ONNX files that exist (else they are refused)")


def run(args: argparse.Namespace) -> int:
    if not args.out:
        raise QkvError("say where to write the export: qkv export RUN --out model.onnx")
    from pathlib import Path

    from qkv.export.onnx import check_exportable, export_onnx, sentence_head_of

    bundle = load(model_path(args), device=use_device(args))
    check_exportable(bundle.model, Path(args.out), overwrite=args.force)
    family = family_of(bundle.model)
    head = sentence_head_of(bundle) if family.role == ENCODER else {}
    print(f"qkv export: tracing {family.title} (a minute for GPT-2 small)...", file=sys.stderr)
    for path in export_onnx(bundle.model, args.out, overwrite=args.force, **head):
        print(f"qkv export: wrote {path} ({path.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
    return 0
