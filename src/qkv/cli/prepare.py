"""Tokenize a corpus once into token shards that `qkv train --data DIR` memory-maps.

DATA is anything `qkv train --data` takes: a text, JSON-lines or Parquet file (.gz/.bz2/.xz/.zst
compressed too), a folder, a glob (quote it), several of these, hf:NAME[:CONFIG][@SPLIT] or hf:FOLDER (a
Hugging Face dataset), pydoc (built in) or tinyshakespeare. The tokenizer trains on a sample spread over
the corpus (--tokenizer-sample MB), then every core encodes, with a progress bar for both phases. Running
the same command again reuses the finished folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qkv.data.prepare import SAMPLE_MB, prepare
from qkv.data.progress import size_text
from qkv.data.shards import SHARD_TOKENS, TokenShards


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data", metavar="DATA", nargs="+", help="the corpus: files, folders, globs, hf:NAME, pydoc")
    parser.add_argument("--out", required=True, metavar="DIR", help="the folder to write (new, or empty)")
    parser.add_argument(
        "--tokenizer",
        default="char",
        help="char, word or bpe (trained on the corpus), or a tokenizer.json to reuse, e.g. a run's (default char)",
    )
    parser.add_argument("--vocab-size", type=int, help="vocabulary size for word/bpe tokenizers")
    parser.add_argument(
        "--text-field", default="text", help="the text field of JSON lines, Parquet and datasets (default text)"
    )
    parser.add_argument(
        "--tokenizer-sample",
        type=float,
        default=SAMPLE_MB,
        metavar="MB",
        help=f"MB of text the tokenizer trains on, spread evenly over a larger corpus (default {SAMPLE_MB:g})",
    )
    parser.add_argument("--val-fraction", type=float, default=0.1, help="the split the manifest records (default 0.1)")
    parser.add_argument(
        "--workers",
        type=int,
        help="encoding processes for char/word (default: one per core for word, 1 for char)",
    )
    parser.add_argument(
        "--shard-tokens", type=int, default=SHARD_TOKENS, help=f"tokens per shard file (default {SHARD_TOKENS:,})"
    )
    parser.add_argument("--verify", action="store_true", help="also check the sha256 of every shard at the end")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from qkv.tokenizers import load_tokenizer

    tokenizer = args.tokenizer
    if tokenizer not in ("char", "word", "bpe") and (Path(tokenizer).is_file() or tokenizer.endswith(".json")):
        tokenizer = load_tokenizer(tokenizer)
    data = args.data[0] if len(args.data) == 1 else args.data
    result = prepare(
        data,
        args.out,
        tokenizer=tokenizer,
        vocab_size=args.vocab_size,
        text_field=args.text_field,
        sample_mb=args.tokenizer_sample,
        val_fraction=args.val_fraction,
        workers=args.workers,
        shard_tokens=args.shard_tokens,
        quiet=args.quiet,
    )
    if args.verify:
        TokenShards(result.folder).verify()
    m = result.manifest
    split, tok = m["split"], m["tokenizer"]
    state = "already prepared (reused)" if result.reused else f"prepared in {sum(m['seconds'].values()):,.1f}s"
    print(
        f"{result.folder}: {state}\n"
        f"  source     {m['source']['name']}: {size_text(m['source']['text_bytes'])} of text\n"
        f"  tokenizer  {tok['kind']}, {tok['vocab_size']:,} entries\n"
        f"  tokens     {m['tokens']:,} ({m['dtype']}, {len(m['shards'])} shard{'s' * (len(m['shards']) != 1)}): "
        f"{split['train_tokens']:,} training / {split['val_tokens']:,} validation at --val-fraction "
        f"{split['val_fraction']:g}\n"
        + ("  checksums  verified\n" if args.verify else "")
        + f"train on it: qkv train --data {result.folder}",
        file=sys.stdout,
    )
    return 0
