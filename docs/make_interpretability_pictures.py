"""Draw the pictures of docs/interpretability.md on small models trained here.

    python docs/make_interpretability_pictures.py --data /path/to/tinyshakespeare/input.txt
    python docs/make_interpretability_pictures.py --data /path/to/tinyshakespeare/input.txt --quick
    python docs/make_interpretability_pictures.py --reuse     # keep runs/docs-shakespeare and runs/docs-dates

It trains a character GPT on Tiny Shakespeare with `qkv train` (the default gpt-micro to its default steps;
with --quick gpt-nano for 300 steps on one thread, about a minute, which drew the pictures of
docs/interpretability.md), and without --quick also the dates translator of docs/make_pictures.py; it
trains the two small attention models of the head-detector test (tests/inspect/test_heads.py, seconds
each), then runs `qkv lens`, `qkv attribute`, `qkv patch` and `qkv heads` on them, writing
docs/images/interp-*.png and printing every command and its output.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from qkv.cli import main

DOCS = Path(__file__).resolve().parent
IMAGES = DOCS / "images"


def qkv(*argv: str) -> None:
    print("$ qkv " + " ".join(repr(a) if " " in a or "\n" in a else a for a in argv), flush=True)
    code = main(list(argv))
    if code:
        sys.exit(code)


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def toy_runs(runs: Path) -> tuple[Path, Path]:
    """The 2-layer and 1-layer attention models the head-detector test trains, saved as run directories."""
    import torch

    from qkv.model_dir import save_model_dir
    from qkv.tokenizers import CharTokenizer

    if str(DOCS.parent) not in sys.path:
        sys.path.insert(0, str(DOCS.parent))  # the test module imports its fixtures as `tests.…`
    test = load(DOCS.parent / "tests" / "inspect" / "test_heads.py", "test_heads")
    tokenizer = CharTokenizer.train("".join(chr(c) for c in range(0x30, 0x6C)))
    torch.set_num_threads(1)
    paths = []
    for layers in (2, 1):
        bundle = test.train_on_repeats(layers, tokenizer)
        paths.append(save_model_dir(runs / f"docs-induction-{layers}", bundle.model, tokenizer))
    return paths[0], paths[1]


def main_(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="tinyshakespeare", help="the Shakespeare text (default: downloaded)")
    parser.add_argument("--runs", default="runs", help="where the runs go (default runs/)")
    parser.add_argument("--reuse", action="store_true", help="do not retrain runs that already exist")
    quick = "gpt-nano for 300 steps on one thread, and no dates translator (the docs' pictures)"
    parser.add_argument("--quick", action="store_true", help=quick)
    args = parser.parse_args(argv)
    runs = Path(args.runs)
    shakespeare, dates = runs / "docs-shakespeare", runs / "docs-dates"
    if not (args.reuse and (shakespeare / "model.safetensors").is_file()):
        quick = ("--preset", "gpt-nano", "--steps", "300", "--threads", "1") if args.quick else ()
        qkv("train", "--data", args.data, *quick, "--seed", "1337", "--out", str(shakespeare), "--quiet",
            "--no-samples")  # fmt: skip
    if not args.quick and not (args.reuse and (dates / "model.safetensors").is_file()):
        load(DOCS / "make_pictures.py", "make_pictures").train_dates(dates)
    two, one = toy_runs(runs)
    IMAGES.mkdir(parents=True, exist_ok=True)
    image = lambda name: str(IMAGES / f"interp-{name}")  # noqa: E731

    line = "ROMEO:\nBut soft! what light through yonder window breaks?"
    qkv("lens", str(shakespeare), line, "--out", image("lens.png"))
    qkv("lens", str(shakespeare), line, "--layer", "1", "--no-plot")
    qkv("lens", str(shakespeare), "ROMEO: To be", "--html", str(runs / "walk.html"), "--no-plot")
    qkv("attribute", str(shakespeare), line, "--out", image("attribution.png"))
    clean, corrupt = "Romeo loves Juliet. Romeo loves J", "Romeo loves Helena. Romeo loves H"
    qkv("patch", str(shakespeare), "--clean", clean, "--corrupt", corrupt, "--out", image("patch.png"))
    qkv("heads", str(shakespeare), "--seed", "0", "--no-plot")
    qkv("heads", str(two), "--length", "16", "--seed", "0", "--out", image("heads-induction.png"))
    qkv("heads", str(one), "--length", "16", "--seed", "0", "--no-plot")
    qkv("lens", str(two), "ABCDABC", "--no-plot")  # one induction circuit, end to end
    qkv("attribute", str(two), "ABCDABC", "--no-plot")
    qkv("patch", str(two), "--clean", "ABCDABC", "--corrupt", "ABCEABC", "--no-plot")
    pictures = ["lens", "attribution", "patch", "heads-induction"]
    if not args.quick:
        date = "Wednesday, 3 March 2021"
        qkv("lens", str(dates), date, "--out", image("lens-dates.png"))
        qkv("patch", str(dates), "--clean", "3 March 2021", "--corrupt", "3 April 2021", "--target", "2021-0",
            "--out", image("patch-dates.png"))  # fmt: skip
        pictures += ["lens-dates", "patch-dates"]
    for picture in pictures:
        path = IMAGES / f"interp-{picture}.png"
        print(f"{path.relative_to(DOCS)}: {path.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main_()
