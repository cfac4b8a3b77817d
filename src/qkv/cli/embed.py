"""Sentence embeddings from an encoder (e.g. a BERT-family model such as all-MiniLM-L6-v2): one vector per
sentence (the mean of its token vectors, normalised if the model says so) and the cosine-similarity
matrix between the sentences. Similar meanings point in similar directions (the GPT notes after
3Blue1Brown's videos: the dot product measures how well two vectors align).

`qkv embed` runs the encoder on sentences; `qkv embeddings` looks at single tokens' vectors, the rows of W_E,
without running the model."""

from __future__ import annotations

import argparse
import json

import torch

from qkv.cli.common import (
    add_device_arguments,
    add_model_argument,
    add_quantize_argument,
    load_for_use,
    load_options,
    model_path,
    use_device,
)
from qkv.errors import QkvError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser, what="an encoder: a qkv run directory or (with --model) a pretrained BERT folder")
    parser.add_argument("sentences", nargs="*", metavar="SENTENCE", help="the sentences to embed and compare")
    parser.add_argument("--json", action="store_true", help="print the embeddings and similarities as JSON")
    add_device_arguments(parser)
    add_quantize_argument(parser)


def run(args: argparse.Namespace) -> int:
    if args.model and args.run_dir:
        args.sentences, args.run_dir = [args.run_dir, *args.sentences], None
    if not args.sentences:
        raise QkvError('give one or more sentences to embed, e.g. qkv embed --model DIR "A man is eating."')
    bundle = load_for_use(
        model_path(args),
        expect="encoder",
        device=use_device(args),
        **load_options(args),
    )
    from qkv.pretrained import embed_sentences

    vectors = embed_sentences(bundle, args.sentences)  # the model's own pooling (mean for qkv encoders)
    unit = torch.nn.functional.normalize(vectors, dim=-1)
    similarity = unit @ unit.T
    if args.json:
        print(json.dumps({"embeddings": vectors.tolist(), "cosine": similarity.tolist()}))
        return 0
    print(f"{len(args.sentences)} sentences -> {vectors.shape[1]}-dimensional embeddings\n")
    for i, sentence in enumerate(args.sentences):
        print(f"[{i}] {sentence}")
    print("\ncosine similarity")
    print("     " + " ".join(f"[{j}]".rjust(7) for j in range(len(args.sentences))))
    for i in range(len(args.sentences)):
        print(f"[{i}]  " + " ".join(f"{similarity[i, j].item():7.3f}" for j in range(len(args.sentences))))
    return 0
