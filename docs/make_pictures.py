"""Draw the pictures of docs/attention.md, docs/next-token.md and docs/embeddings.md on small trained models.

    python docs/make_pictures.py              # train two small models (5-15 minutes on 2 CPU cores), then draw
    python docs/make_pictures.py --reuse      # reuse runs/docs-gpt and runs/docs-dates if they exist

It trains a character-level GPT (preset gpt-nano) on the built-in corpus and a small translator on the
built-in dates task (human-written dates -> ISO dates), both with `qkv train` exactly as a user would, and
then runs `qkv attention`, `qkv next` and `qkv embeddings` on them, writing into docs/images/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qkv.cli import main

DOCS = Path(__file__).resolve().parent
IMAGES = DOCS / "images"


def qkv(*argv: str) -> None:
    print("$ qkv " + " ".join(f'"{a}"' if " " in a else a for a in argv), flush=True)
    code = main(list(argv))
    if code:
        sys.exit(code)


def train_gpt(run: Path) -> None:
    qkv(
        "train", "--preset", "gpt-nano", "--steps", "800", "--warmup-steps", "50", "--eval-interval", "400",
        "--eval-batches", "10", "--seed", "1337", "--out", str(run), "--quiet", "--no-samples",
    )  # fmt: skip


def train_dates(run: Path) -> None:
    qkv(
        "train", "--task", "translate", "--d-model", "64", "--n-heads", "4", "--d-ff", "256", "--steps", "700",
        "--batch-size", "32", "--lr", "2e-3", "--warmup-steps", "50", "--eval-interval", "700", "--eval-batches",
        "5", "--bleu-sentences", "50", "--seed", "1337", "--out", str(run), "--quiet", "--no-samples",
    )  # fmt: skip


def main_(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="runs", help="where the two runs go (default runs/)")
    parser.add_argument("--reuse", action="store_true", help="do not retrain runs that already exist")
    args = parser.parse_args(argv)
    gpt, dates = Path(args.runs) / "docs-gpt", Path(args.runs) / "docs-dates"
    if not (args.reuse and (gpt / "model.safetensors").is_file()):
        train_gpt(gpt)
    if not (args.reuse and (dates / "model.safetensors").is_file()):
        train_dates(dates)
    IMAGES.mkdir(parents=True, exist_ok=True)
    image = lambda name: str(IMAGES / name)  # noqa: E731

    # docs/attention.md
    qkv("attention", str(gpt), "The quick brown fox jumps", "--out", image("attention-grid.png"))
    qkv("attention", str(gpt), "The quick fox", "--layer", "1", "--head", "2", "--out", image("attention-head.png"))
    date = "Wednesday, 3 March 2021"
    # the HTML page holds all three kinds of attention, whatever --part draws as PNG
    qkv("attention", str(dates), date, "--part", "cross", "--out", image("attention-cross.png"),
        "--html", image("attention-dates.html"))  # fmt: skip
    qkv("attention", str(dates), date, "--part", "cross", "--layer", "1", "--head", "0",
        "--out", image("attention-cross-head.png"))  # fmt: skip
    qkv("attention", str(dates), date, "--part", "encoder", "--out", image("attention-encoder.png"))

    # docs/next-token.md
    qkv("next", str(gpt), "The function ret", "--top", "8", "--out", image("next-token.png"))
    qkv("next", str(dates), date, "--target", "2021-0", "--top", "5", "--out", image("next-token-dates.png"))

    # docs/embeddings.md
    qkv("embeddings", str(gpt), "--out", image("embeddings.png"), "--positions", image("positions-none.png"))
    Path(image("positions-none.png")).unlink(missing_ok=True)  # gpt-nano uses RoPE: no table of its own
    qkv("embeddings", str(dates), "--out", image("embeddings-dates.png"), "--positions", image("positions.png"))
    for picture in sorted(IMAGES.glob("*")):
        print(f"{picture.relative_to(DOCS)}: {picture.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main_()
