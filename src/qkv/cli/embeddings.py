"""Look at a model's token embeddings W_E: nearest neighbours by cosine similarity, analogies a - b + c
(E(king) - E(man) + E(woman)), a labelled 2-D map (PCA) of the embeddings, and a picture of the
positional-encoding table.

With --neighbours, --analogy or --analogies the answers are printed (pictures only if --out/--positions
are given); with none of them, both pictures are drawn into the run folder (a Word2Vec run has no
positions: only the map).
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
from typing import TYPE_CHECKING

from qkv.cli.common import add_device_arguments, add_model_argument, use_device
from qkv.cli.options import add_alias, add_top_argument, note, picture_path
from qkv.errors import QkvError
from qkv.loading import load
from qkv.models.family import family_of

if TYPE_CHECKING:
    from rich.console import JustifyMethod


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser)
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
    add_top_argument(parser, default=5, what="how many answers per question")
    parser.add_argument(
        "--out", metavar="FILE",
        help="the 2-D map to write (drawn by default when nothing else is asked: RUN_DIR/embeddings.png)",
    )  # fmt: skip
    add_alias(parser, "--plot", of="--out", dest="out")
    parser.add_argument("--tokens", nargs="+", metavar="TOKEN", help="the tokens to put on the map")
    parser.add_argument(
        "--first", type=int, metavar="N",
        help="otherwise the map shows the first N non-special ids (default: all characters, or 100)",
    )  # fmt: skip
    parser.add_argument(
        "--positions", nargs="?", const="", metavar="FILE",
        help="draw the positional table (default RUN_DIR/positions.png, or ./positions.png without a model)",
    )  # fmt: skip
    parser.add_argument("--length", type=int, default=64, help="positions in that picture (default 64)")
    parser.add_argument("--d-model", type=int, default=64, help="its width when there is no model (default 64)")
    parser.add_argument(
        "--target-side", action="store_true", dest="target", help="a translator's target embedding, not its source"
    )
    add_alias(parser, "--target", of="--target-side", dest="target", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the answers as JSON")


def run(args: argparse.Namespace) -> int:
    from qkv.inspect import embeddings as emb
    from qkv.inspect.figures import draw_embedding_map, draw_positional_table

    if args.run_dir and args.model:
        raise QkvError("give the model once: either RUN_DIR or --model")
    if args.top < 1 or (args.first is not None and args.first < 2) or args.length < 1 or args.d_model < 1:
        raise QkvError("--top, --length and --d-model must be at least 1 and --first at least 2")
    path = args.run_dir or args.model
    asked = bool(args.neighbours or args.analogy or args.analogies)
    if path is None and (asked or args.out or args.positions is None):
        raise QkvError("which model? give a run directory (RUN_DIR) or --model; only --positions works without one")
    bundle = load(path, device=use_device(args), dequantize=True) if path else None
    if args.target and (bundle is None or not family_of(bundle.model).two_vocabularies):
        raise QkvError("--target-side is for translators, which have a source and a target embedding")
    has_positions = bundle is None or family_of(bundle.model).has("positions")
    if args.positions is not None and not has_positions:  # it drew the paper's sinusoid, which this model never adds
        assert bundle is not None  # without a model there are positions (the paper's)
        raise QkvError(
            f"{family_of(bundle.model).title} adds no positions to its vectors, so it has no table to draw: drop "
            "--positions, or give it without a model for the paper's sinusoidal table"
        )
    plot = picture_path(args.out, args.run_dir, "embeddings.png") if args.out or not asked else None
    draw_positions = args.positions is not None or (not asked and has_positions)
    positions = picture_path(args.positions, args.run_dir, "positions.png") if draw_positions else None
    out = _answers(args, bundle)
    pictures = []
    if plot and bundle is not None:
        table, tokenizer = emb.embedding_matrix(bundle, target=args.target)
        ids = emb.tokens_to_plot(tokenizer, tokens=args.tokens, top=args.first)
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
    columns: list[tuple[str, JustifyMethod]] = [("section", "left"), ("correct", "right"), ("answered", "right"),
                                                ("skipped", "right")]  # fmt: skip
    for name, justify in columns:
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


def _answers(args: argparse.Namespace, bundle) -> dict:
    """The neighbours, the analogy and the analogy test the user asked for, by name."""
    from qkv.inspect import embeddings as emb

    out: dict = {}
    if args.neighbours:
        out["neighbours"] = {t: emb.neighbours_of(bundle, t, k=args.top, target=args.target) for t in args.neighbours}
        alike = emb.alike_note(list(out["neighbours"].values()))
        if alike:
            note(alike)
    if args.analogy:
        a, b, c = args.analogy
        answers = emb.analogy_of(bundle, a, b, c, k=args.top, target=args.target)
        out["analogy"] = {"a": a, "b": b, "c": c, "answers": answers}
    if args.analogies:
        from qkv.inspect.analogies import analogy_accuracy

        result = analogy_accuracy(bundle, args.analogies, restrict_vocab=args.restrict_vocab, target=args.target)
        out["analogies"] = result.to_dict()
    return out
