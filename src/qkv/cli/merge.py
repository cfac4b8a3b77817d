"""Fold a LoRA run's adapters into its base: a whole model folder (config.json, model.safetensors, tokenizer.json,
chat_template.jinja) holding W + (alpha / r) B A in every adapted projection, which every verb opens without the
base, and `qkv export --gguf` turns into one GGUF file for llama.cpp (qkv.export.merge). A run trained over an int8
base is merged into the float base.
"""

from __future__ import annotations

import argparse
import sys

from qkv.cli.common import add_device_arguments, use_device
from qkv.export.merge import merge_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a LoRA run (qkv train --from MODEL --lora RANK) or a "
                        "PEFT adapter folder (adapter_config.json, adapter_model.safetensors)")  # fmt: skip
    parser.add_argument("--out", metavar="DIR", required=True, help="the folder to write the merged model to")
    parser.add_argument("--force", action="store_true", help="replace a model already in DIR")
    add_device_arguments(parser, default="cpu", why="")


def run(args: argparse.Namespace) -> int:
    out = merge_run(args.run_dir, args.out, force=args.force, device=use_device(args))
    print(f"qkv merge: wrote {out} (qkv generate {out}; qkv export {out} --gguf model.gguf)", file=sys.stderr)
    return 0
