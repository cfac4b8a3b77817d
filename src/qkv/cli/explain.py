"""Show, step by step and with real numbers, what one attention head does: tokens, embeddings (+ positions),
Q, K, V, the scores Q K^T, the scaling by 1/sqrt(d_k), the causal mask, the softmax weights, the weighted sum
of the values, and (for a multi-head layer) the heads concatenated and projected by W_o.

Where the numbers come from (give at most one):

  --run RUN_DIR / --model NAME   a real model's layer and head (--layer, --head, --part), read from its
                                 own forward pass on TEXT
  --qkv FILE                     your Q, K, V, one row per token (JSON or CSV)
  --embeddings FILE              your embeddings X (and W_q, W_k, W_v, W_o if the file has them; the
                                 missing ones are torch.rand with --seed)
  --example quick-fox | journey | journey-weights
                                 a worked example (quick-fox, the default: "The quick brown fox jumps"
                                 with its Q, K, V, from notes on "Attention Is All You Need"; journey:
                                 "Your journey starts with one step" without trainable weights, from
                                 Raschka's Build a Large Language Model (From Scratch), section 3.3.1;
                                 journey-weights adds W = torch.rand after torch.manual_seed(123), the
                                 book's section 3.4; see docs/references.md)

Any other TEXT without a model or file gets random 4-dimensional embeddings and random weights (--seed),
which shows the mechanism but not a trained model's numbers. --json prints every number instead.
"""

from __future__ import annotations

import argparse
import json
import sys

from qkv.cli.common import MODEL_HELP, add_device_arguments
from qkv.cli.options import SEED_DEFAULT, add_seed_argument, add_target_argument
from qkv.errors import QkvError
from qkv.loading import load


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("text", nargs="?", help='the text, e.g. "The quick brown fox jumps" (the default example)')
    source = parser.add_argument_group("where the numbers come from")
    source.add_argument("--run", dest="run_dir", metavar="RUN_DIR", help="a run directory written by `qkv train`")
    add_device_arguments(source)
    source.add_argument("--model", help=MODEL_HELP)
    source.add_argument("--qkv", metavar="FILE", help="Q, K, V per token from a .json or .csv file")
    source.add_argument("--embeddings", metavar="FILE", help="embeddings X (and optionally W_q, W_k, W_v, W_o)")
    source.add_argument(
        "--example",
        metavar="NAME",
        help="a worked example: quick-fox (the notes on Attention Is All You Need), journey or journey-weights "
        "(Raschka, Build a Large Language Model (From Scratch), sections 3.3.1 and 3.4); see docs/references.md",
    )
    which = parser.add_argument_group("which head and query")
    which.add_argument("--layer", type=int, default=0, help="layer of a real model (default 0)")
    which.add_argument("--head", type=int, default=0, help="head to show (default 0)")
    which.add_argument(
        "--part", choices=("encoder", "decoder", "cross"), help="a translator's attention (default encoder)"
    )
    add_target_argument(which)
    which.add_argument(
        "--query", help="focus on this token (its text or its index); the examples focus on their source's"
    )
    which.add_argument(
        "--causal", action=argparse.BooleanOptionalAction, default=None,
        help="hide later tokens (default: as the model does; no mask for the examples and files)",
    )  # fmt: skip
    made = parser.add_argument_group("random weights (--embeddings, 003-weights, other texts)")
    made.add_argument("--heads", type=int, default=1, help="split the projections into this many heads (default 1)")
    made.add_argument("--d-k", type=int, default=2, help="columns per head of W_q, W_k, W_v (default 2)")
    add_seed_argument(made, what="seed of torch.rand for missing weights", default=None,
                      shown=f"{SEED_DEFAULT}; 003-weights: the book's 123")  # fmt: skip
    shown = parser.add_argument_group("output")
    shown.add_argument("--digits", type=int, default=4, help="decimals shown (default 4)")
    shown.add_argument("--max-columns", type=int, default=10, help="columns shown per matrix (default 10)")
    shown.add_argument("--json", action="store_true", help="print every number as JSON instead of tables")


def _check_explain_args(args: argparse.Namespace) -> None:
    """QkvError unless the arguments name at most one source of numbers, positive shapes and a non-empty text."""
    sources = [name for name in ("run_dir", "model", "qkv", "embeddings", "example") if getattr(args, name)]
    if len(sources) > 1:
        flags = " and ".join("--" + ("run" if s == "run_dir" else s) for s in sources)
        raise QkvError(f"give one source of numbers, not {flags}")
    if args.heads < 1 or args.d_k < 1:
        raise QkvError("--heads and --d-k must be at least 1")
    if args.text is not None and not args.text.strip():
        raise QkvError("the text is empty: give some text, or leave it out for the worked example")


def _explain(args: argparse.Namespace):
    """The explanation of one attention computation: a model's (--run/--model), a file's numbers (--qkv,
    --embeddings), one of the book's worked examples, or random vectors for the text."""
    seed_given = args.seed is not None
    args.seed = args.seed if seed_given else SEED_DEFAULT
    _check_explain_args(args)
    query = args.query
    causal = bool(args.causal)
    if args.run_dir or args.model:
        return _model_explanation(args, query)
    words = args.text.split() if args.text else None
    if args.qkv or args.embeddings:
        return _file_explanation(args, words, causal, query)
    explanation = _book_example(args, words, seed_given, causal, query)
    if explanation is not None:
        return explanation
    assert words is not None  # no text is the quick-fox example, above
    return _random_example(words, args, causal, query)


def _model_explanation(args: argparse.Namespace, query: str | None):
    """Q, K, V and the weights of a loaded model's layer and head on the text (the model's own mask)."""
    from qkv.cli.common import note_unknown, use_device
    from qkv.inspect.explain_model import explain_model

    if not args.text:
        raise QkvError('give the text to run the model on, e.g. qkv explain "The quick brown fox" --run RUN_DIR')
    bundle = load(args.run_dir or args.model, device=use_device(args), dequantize=True)
    note_unknown(bundle.tokenizer, args.text, what="the text")
    return explain_model(
        bundle, args.text, layer=args.layer, head=args.head, part=args.part, causal=args.causal, query=query,
        target=args.target,
    )  # fmt: skip


def _file_explanation(args: argparse.Namespace, words: list[str] | None, causal: bool, query: str | None):
    """The numbers of a file: Q, K, V as given (--qkv), or embeddings X projected by its (or random) weights."""
    from pathlib import Path

    from qkv.inspect import examples
    from qkv.inspect.explain import explain_given, explain_projected

    path = Path(args.qkv or args.embeddings)
    file_tokens, matrices = examples.read_matrices(path)
    if args.qkv:
        missing = [n for n in ("Q", "K", "V") if n not in matrices]
        if missing:
            raise QkvError(f"{path} lacks {', '.join(missing)}: give Q, K and V (one row per token)")
        tokens = examples.check_tokens(file_tokens, words, len(matrices["Q"]), path)
        explanation = explain_given(
            tokens, matrices["Q"], matrices["K"], matrices["V"], causal=causal, query=query, title=str(path)
        )
        if "X" in matrices:
            explanation.embeddings = matrices["X"]
        return explanation
    if "X" not in matrices:
        raise QkvError(f"{path} has no embeddings: give X (one row per token), or use --qkv for Q, K, V")
    tokens = examples.check_tokens(file_tokens, words, len(matrices["X"]), path)
    weights = {name: matrices.get(name) for name in ("W_q", "W_k", "W_v", "W_o")}
    return explain_projected(
        tokens, matrices["X"], **weights, n_heads=args.heads, head=args.head, d_k=args.d_k, seed=args.seed,
        causal=causal, query=query, title=str(path),
    )  # fmt: skip


def _book_example(args: argparse.Namespace, words: list[str] | None, seed_given: bool, causal: bool,
                  query: str | None):  # fmt: skip
    """The book's worked example the arguments name (--example, or its exact words, or no text at all), or
    None when they name none."""
    from qkv.inspect import examples

    example = None if args.example is None else examples.example_name(args.example)  # 004 and 003 still work
    if example is None:
        if words in (None, examples.QUICK_FOX_TOKENS):
            example = "quick-fox"
        elif words == examples.JOURNEY_TOKENS:
            example = "journey"
    if example is None:
        return None
    own = examples.QUICK_FOX_TOKENS if example == "quick-fox" else examples.JOURNEY_TOKENS
    if words is not None and words != own:
        raise QkvError(f"example {example} has its own text: drop the text, or drop --example for random vectors")
    seed = args.seed if seed_given else 123  # the book's torch.manual_seed(123)
    return examples.explain_example(
        example, causal=causal, query=query, seed=seed, d_k=args.d_k, n_heads=args.heads, head=args.head
    )


def _random_example(words: list[str], args: argparse.Namespace, causal: bool, query: str | None):
    import torch

    from qkv.inspect.explain import explain_projected

    generator = torch.Generator().manual_seed(args.seed)
    x = torch.rand(len(words), 4, generator=generator).double()  # (T, 4): random "embeddings"
    explanation = explain_projected(
        words, x, n_heads=args.heads, head=args.head, d_k=args.d_k, seed=args.seed + 1, causal=causal, query=query,
        title=f"random vectors for {' '.join(words)!r}",
    )  # fmt: skip
    explanation.embeddings, explanation.inputs = explanation.inputs, None
    explanation.notes.insert(
        0,
        "no model given: the embeddings and weights are random (torch.rand), so the numbers show the mechanism, "
        "not meaning; give --run RUN_DIR for a trained model, or --embeddings/--qkv for your own numbers.",
    )
    return explanation


def run(args: argparse.Namespace) -> int:
    explanation = _explain(args)
    if args.json:
        json.dump(explanation.to_dict(), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    from qkv.inspect.explain_view import render_explanation

    if args.digits < 0 or args.max_columns < 1:
        raise QkvError("--digits must be >= 0 and --max-columns >= 1")
    render_explanation(explanation, digits=args.digits, max_columns=args.max_columns)
    return 0
