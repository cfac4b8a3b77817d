"""Export a model to ONNX, to run it with ONNX Runtime or another ONNX engine without PyTorch, or a GPT or Llama
language model to GGUF (``--gguf FILE``), to run it with llama.cpp and the programs built on it.

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser, what="the model to export: a run directory (or --model for a pretrained one)")
    add_device_arguments(parser, default="cpu", why="; the graph is traced on the CPU whatever the device")
    parser.add_argument(
        "--out", metavar="FILE.onnx",
        help="write the ONNX graph(s) here (a name ending in .onnx; a translator's two files add .encoder, .decoder)",
    )  # fmt: skip
    add_alias(parser, "--onnx", of="--out", dest="out")
    parser.add_argument(
        "--gguf", metavar="FILE.gguf",
        help="write a GGUF file for llama.cpp instead (GPT and Llama language models, with their tokenizer)",
    )  # fmt: skip
    parser.add_argument(
        "--gguf-type", choices=("f16", "f32"), default="f16",
        help="how --gguf stores the matrices: f16 (the default: half the size, as llama.cpp's converter writes; "
        "each weight rounded to 11 significant bits) or f32 (every bit kept)",
    )  # fmt: skip
    parser.add_argument(
        "--gguf-approximate-gelu", action="store_true",
        help="--gguf for a GPT trained with the exact GELU: accept llama.cpp's tanh approximation of it",
    )  # fmt: skip
    parser.add_argument("--force", action="store_true", help="replace files that exist (else they are refused)")


def run(args: argparse.Namespace) -> int:
    if args.gguf:
        return run_gguf(args)
    if not args.out:
        raise QkvError("say where to write the export: qkv export RUN --out model.onnx (or --gguf model.gguf)")
    from pathlib import Path

    from qkv.export.onnx import check_exportable, export_onnx, sentence_head_of

    bundle = load(model_path(args), device=use_device(args), merge_adapters=True)  # a LoRA run: merged
    check_exportable(bundle.model, Path(args.out), overwrite=args.force)
    family = family_of(bundle.model)
    head = sentence_head_of(bundle) if family.role == ENCODER else {}
    print(f"qkv export: tracing {family.title} (a minute for GPT-2 small)...", file=sys.stderr)
    for path in export_onnx(bundle.model, args.out, overwrite=args.force, **head):
        print(f"qkv export: wrote {path} ({path.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
    return 0


def run_gguf(args: argparse.Namespace) -> int:
    """qkv export RUN --gguf FILE: the model and its tokenizer (and chat template) as one GGUF file."""
    from pathlib import Path

    from qkv.export.gguf import export_gguf

    if args.out:
        raise QkvError("give one export at a time: --out (ONNX) or --gguf (GGUF)")
    path = Path(args.gguf)
    if path.exists() and not args.force:
        raise QkvError(f"{path} exists: add --force to replace it, or choose another name")
    bundle = load(model_path(args), device=use_device(args), merge_adapters=True)  # a LoRA run: merged
    written = export_gguf(
        bundle.model,
        bundle.tokenizer,
        path,
        gguf_type=args.gguf_type,
        chat_template=bundle.chat_template,
        approximate_gelu=args.gguf_approximate_gelu,
    )
    print(f"qkv export: wrote {written} ({written.stat().st_size / 1e6:.1f} MB, {args.gguf_type})", file=sys.stderr)
    return 0
