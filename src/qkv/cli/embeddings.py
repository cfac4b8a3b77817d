"""Look at a model's token embeddings W_E: nearest neighbours by cosine similarity, analogies a - b + c
(E(king) - E(man) + E(woman)), a labelled 2-D map (PCA) of the embeddings, and a picture of the
positional-encoding table.

With --neighbours, --analogy or --analogies the answers are printed (pictures only if --plot/--positions
are given); with none of them, both pictures are drawn (a Word2Vec run has no positions: only the map).
--analogies FILE scores a questions-words file (": section" lines, then "a b c d" questions) section by
section, as gensim's evaluate_word_analogies does, over the --restrict-vocab most frequent words.
Analogies exclude a, b and c from the answer, as word2vec does, and scale the three vectors to length 1
first. Special tokens (<pad>, <bos>, ...) are never answers. Without a model, --positions draws the paper's
sinusoidal table for --d-model.

`qkv embeddings` reads the table W_E (one vector per token, no forward pass); `qkv embed` runs an encoder on
whole sentences and compares the sentence vectors.
"""

from __future__ import annotations

import argparse
import json

from qkv.cli.common import add_device_arguments, use_device
from qkv.errors import QkvError
from qkv.loading import load
from qkv.models.family import family_of

HELP = "token embeddings W_E: neighbours, analogies, a 2-D map; the positional table (sentences: qkv embed)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", nargs="?", help="a run directory written by `qkv train`")
    parser.add_argument("--model", help="a pretrained model instead: a Hugging Face folder or a Hub name")
    add_device_arguments(parser)
    parser.add_argument("--neighbours", nargs="+", metavar="TOKEN", help="nearest tokens to each TOKEN by cosine")
    parser.add_argument("--analogy", nargs=3, metavar=("A", "B", "C"), help="tokens nearest to A - B + C")
    parser.add_argument(
        "--analogies", metavar="FILE", help="accuracy on a questions-words file (': section' lines, 'a b c d' lines)"
    )
    parser.add_argument(
        "--restrict-vocab",
        type=int,
        default=30_000,
        metavar="N",
        help="--analogies: only the N most frequent words take part (default 30000, as in the word2vec paper)",
    )
    parser.add_argument("-k", type=int, default=5, help="how many answers (default 5)")
    parser.add_argument("--plot", help="the 2-D map to write (default embeddings.png when nothing else is asked)")
    parser.add_argument("--tokens", nargs="+", metavar="TOKEN", help="the tokens to put on the map")
    parser.add_argument(
        "--top", type=int, help="otherwise the first N non-special ids (default: all characters, or 100)"
    )
    parser.add_argument("--positions", help="the positional-table picture to write (default positions.png)")
    parser.add_argument("--length", type=int, default=64, help="positions in that picture (default 64)")
    parser.add_argument("--d-model", type=int, default=64, help="its width when there is no model (default 64)")
    parser.add_argument("--target", action="store_true", help="a translator's target embedding instead of its source")
    parser.add_argument("--json", action="store_true", help="print the answers as JSON")


def run(args: argparse.Namespace) -> int:
    from qkv.inspect import embeddings as emb
    from qkv.inspect.figures import draw_embedding_map, draw_positional_table

    if args.run_dir and args.model:
        raise QkvError("give the model once: either RUN_DIR or --model")
    if args.k < 1 or (args.top is not None and args.top < 2) or args.length < 1 or args.d_model < 1:
        raise QkvError("-k, --length and --d-model must be at least 1 and --top at least 2")
    path = args.run_dir or args.model
    asked = bool(args.neighbours or args.analogy or args.analogies)
    if path is None and (asked or args.plot or not args.positions):
        raise QkvError("which model? give a run directory (RUN_DIR) or --model; only --positions works without one")
    bundle = load(path, device=use_device(args)) if path else None
    has_positions = bundle is None or family_of(bundle.model).has("positions")
    if args.positions and not has_positions:  # it used to draw the paper's sinusoid, which this model never adds
        raise QkvError(
            f"{family_of(bundle.model).title} adds no positions to its vectors, so it has no table to draw: drop "
            "--positions, or give it without a model for the paper's sinusoidal table"
        )
    plot = args.plot or (None if asked else "embeddings.png")
    positions = args.positions or (None if asked or not has_positions else "positions.png")
    out: dict = {}
    if args.neighbours:
        out["neighbours"] = {t: emb.neighbours_of(bundle, t, k=args.k, target=args.target) for t in args.neighbours}
    if args.analogy:
        a, b, c = args.analogy
        answers = emb.analogy_of(bundle, a, b, c, k=args.k, target=args.target)
        out["analogy"] = {"a": a, "b": b, "c": c, "answers": answers}
    if args.analogies:
        from qkv.inspect.analogies import analogy_accuracy

        result = analogy_accuracy(bundle, args.analogies, restrict_vocab=args.restrict_vocab, target=args.target)
        out["analogies"] = result.to_dict()
    pictures = []
    if plot and bundle is not None:
        table, tokenizer = emb.embedding_matrix(bundle, target=args.target)
        ids = emb.tokens_to_plot(tokenizer, tokens=args.tokens, top=args.top)
        points, explained = emb.pca_2d(table[ids])
        labels = [emb.token_label(tokenizer, i) for i in ids]
        title = f"token embeddings W_E of {bundle.path.name}: {len(ids)} tokens on their first two principal components"
        pictures.append(draw_embedding_map(points, labels, plot, explained=explained, title=title))
    if positions:
        table, title = emb.positional_table(bundle, length=args.length, d_model=args.d_model)
        pictures.append(draw_positional_table(table, positions, title=title))
    out["pictures"] = [str(p.path) for p in pictures]
    if args.json:
        print(json.dumps(out, ensure_ascii=False))
        return 0
    _print(out)
    return 0


def _print(out: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    for token, found in out.get("neighbours", {}).items():
        table = Table(title=Text(f"nearest to {token!r} (cosine similarity)"), title_justify="left", show_edge=False)
        table.add_column("#", justify="right")
        table.add_column("token")
        table.add_column("cosine", justify="right")
        for rank, (tok, sim) in enumerate(found, start=1):
            table.add_row(str(rank), Text(tok), f"{sim:.4f}")
        console.print(table)
    if "analogy" in out:
        a = out["analogy"]
        title = f"{a['a']!r} - {a['b']!r} + {a['c']!r} ≈ (a, b, c excluded)"
        table = Table(title=Text(title), title_justify="left", show_edge=False)
        table.add_column("#", justify="right")
        table.add_column("token")
        table.add_column("cosine", justify="right")
        for rank, (tok, sim) in enumerate(a["answers"], start=1):
            table.add_row(str(rank), Text(tok), f"{sim:.4f}")
        console.print(table)
    if "analogies" in out:
        console.print(analogy_table(out["analogies"]))
    for picture in out["pictures"]:
        console.print(Text(f"wrote {picture}"))


def analogy_table(result: dict):
    """A rich table of ``AnalogyResult.to_dict()``: one row per section, then the total."""
    from rich.table import Table
    from rich.text import Text

    title = f"analogy accuracy (3CosAdd over the {result['restrict_vocab']:,} most frequent words)"
    table = Table(title=Text(title), title_justify="left", show_edge=False)
    for name, justify in (("section", "left"), ("correct", "right"), ("answered", "right"), ("skipped", "right")):
        table.add_column(name, justify=justify)
    table.add_column("accuracy", justify="right")
    for row in result["sections"]:
        cells = (row["section"], str(row["correct"]), str(row["answered"]), str(row["skipped"]))
        table.add_row(*cells, f"{100 * row['accuracy']:.1f}%")
    total = result["total"]
    skipped = total["questions"] - total["answered"]
    cells = ("total", str(total["correct"]), str(total["answered"]), str(skipped))
    table.add_row(*cells, f"{100 * total['accuracy']:.1f}%", style="bold")
    return table
