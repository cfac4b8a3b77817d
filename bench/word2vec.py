"""Word2Vec in qkv against gensim: the same corpus, the same hyperparameters, one run.

For each architecture (skip-gram, CBOW) both tools train on the same lower-cased corpus with word2vec's
defaults (100 dimensions, window 5, 5 negatives, subsampling 1e-3, minimum count 5, learning rate 0.025
decaying linearly to 0.0001, 5 epochs); gensim with ``workers=2``, qkv through `qkv train --task word2vec`'s
own function. Reported, side by side:

- analogy accuracy on gensim's copy of questions-words.txt, per section and in total, both scored by qkv's
  evaluator (3CosAdd over the 30,000 most frequent words, as gensim's ``evaluate_word_analogies``; gensim's
  own evaluator is run on its vectors too, to show the two evaluators agree);
- training speed in corpus words per second (all words of the text, before the minimum count and the
  subsampling, times the epochs, over the training time) and the qkv / gensim ratio.

Targets (issue 16): accuracy within 1 point of gensim; words/s >= 0.5x gensim on a CPU (and ahead on a GPU).
The corpus is the largest English text at hand: the built-in corpus (Python's documentation), Tiny
Shakespeare, the English side of Multi30k's training set and of the Tatoeba eng-fra pairs (../shared/data).
A PCA map of qkv's skip-gram vectors goes to docs/images/word2vec_pca.png.

    python bench/word2vec.py             # both architectures, 5 epochs
    python bench/word2vec.py --quick     # skip-gram, 1 epoch on a quarter of the corpus
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from qkv.data.builtin import builtin_corpus
from qkv.inspect.analogies import evaluate_analogies, read_analogies
from qkv.inspect.embeddings import embedding_matrix, pca_2d, special_ids
from qkv.inspect.figures import draw_embedding_map
from qkv.model_dir import load_model_dir
from qkv.tokenizers.word import WORD_PATTERN
from qkv.training import TrainConfig, train_word2vec

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
MAP_WORDS = (
    "king queen man woman boy girl father mother son daughter brother sister husband wife "
    "france paris germany berlin england london italy rome "
    "good better best bad worse big bigger small smaller "
    "walk walked walking go went going see saw seeing"
).split()
SETTINGS = dict(d_model=100, window=5, negative=5, sample=1e-3, min_count=5, lr=0.025, min_lr=0.0001, epochs=5)


def corpus_lines() -> tuple[list[str], list[str]]:
    """The lower-cased lines of every English text at hand, and what they came from."""
    parts = [("built-in corpus (Python's documentation)", builtin_corpus().splitlines())]
    files = [
        ("Tiny Shakespeare", SHARED / "tinyshakespeare" / "input.txt", None),
        ("Multi30k train.en", SHARED / "multi30k" / "train.en", None),
        ("eng-fra (English side)", SHARED / "eng-fra" / "eng-fra.txt", 0),
    ]
    for name, path, column in files:
        if path.is_file():
            lines = path.read_text(encoding="utf-8").splitlines()
            parts.append((name, [line.split("\t")[column] for line in lines] if column is not None else lines))
    lines = [line.lower() for _, text in parts for line in text if line.strip()]
    return lines, [name for name, _ in parts]


def train_gensim(sentences: list[list[str]], arch: str, epochs: int, seed: int, lr: float) -> tuple[object, float]:
    from gensim.models import Word2Vec

    model = Word2Vec(
        vector_size=SETTINGS["d_model"],
        window=SETTINGS["window"],
        negative=SETTINGS["negative"],
        sample=SETTINGS["sample"],
        min_count=SETTINGS["min_count"],
        alpha=lr,
        min_alpha=SETTINGS["min_lr"],
        sg=int(arch == "skipgram"),
        workers=2,
        epochs=epochs,
        seed=seed,
    )
    model.build_vocab(sentences)
    start = time.perf_counter()
    model.train(sentences, total_examples=model.corpus_count, epochs=epochs)
    return model, time.perf_counter() - start


def train_qkv(
    corpus: Path, arch: str, epochs: int, seed: int, device: str, threads: int, out: Path, lr: float, **qkv_settings
):
    settings = {k: v for k, v in SETTINGS.items() if k != "d_model"} | {"lr": lr} | qkv_settings
    config = TrainConfig.create(
        task="word2vec",
        data=str(corpus),
        out_dir=str(out),
        arch=arch,
        seed=seed,
        device=device,
        threads=threads,
        eval_interval=10**9,  # evaluate once, at the end
        model={"d_model": SETTINGS["d_model"]},
        **{**settings, "epochs": epochs},
    )
    result = train_word2vec(config, quiet=True)
    return load_model_dir(result.run_dir), result.train_seconds


def qkv_vectors(bundle) -> tuple[np.ndarray, list[str]]:
    table, tokenizer = embedding_matrix(bundle)
    ids = [i for i in range(tokenizer.vocab_size) if i not in special_ids(tokenizer)]
    return table[ids], [tokenizer.id_to_token(i) for i in ids]


def draw_map(bundle, path: Path) -> None:
    table, words = qkv_vectors(bundle)
    index = {w: i for i, w in enumerate(words)}
    chosen = [w for w in MAP_WORDS if w in index]
    points, explained = pca_2d(table[[index[w] for w in chosen]])
    title = f"Word2Vec (skip-gram) vectors of {len(chosen)} words on their first two principal components"
    draw_embedding_map(points, chosen, path, explained=explained, title=title)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="skip-gram only, 1 epoch, a quarter of the corpus")
    parser.add_argument("--arch", nargs="+", choices=["skipgram", "cbow"], help="architectures (default both)")
    parser.add_argument("--epochs", type=int, help="passes over the corpus (default 5, --quick 1)")
    parser.add_argument("--device", default="auto", help="qkv's device: auto, cpu or cuda")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--threads", type=int, default=1, help="qkv's CPU threads (default 1: its batches are small, see docs)"
    )
    parser.add_argument("--batch-size", type=int, help="qkv's words per step (default: qkv's own default)")
    parser.add_argument(
        "--lr", type=float, help="both tools' starting learning rate (default 0.025; word2vec.c uses 0.05 for CBOW)"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results here")
    parser.add_argument("--map", default=str(ROOT / "docs" / "images" / "word2vec_pca.png"), help="PCA map path")
    args = parser.parse_args(argv)
    try:
        from gensim.test.utils import datapath
    except ImportError:
        sys.exit("this benchmark compares with gensim: pip install gensim (it is in the test extra)")
    archs = args.arch or (["skipgram"] if args.quick else ["skipgram", "cbow"])
    epochs = args.epochs or (1 if args.quick else SETTINGS["epochs"])
    lines, sources = corpus_lines()
    if args.quick:
        lines = lines[: len(lines) // 4]
    sentences = [WORD_PATTERN.findall(line) for line in lines]
    n_words = sum(len(s) for s in sentences)
    questions = datapath("questions-words.txt")
    work = Path(tempfile.mkdtemp(prefix="qkv-word2vec-"))
    corpus = work / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    print(f"corpus: {' + '.join(sources)}, lower-cased: {len(lines):,} lines, {n_words:,} words")
    settings = SETTINGS | {"epochs": epochs, "lr": args.lr or SETTINGS["lr"]}
    print(f"settings: {settings}; gensim workers=2; qkv on {device}, {args.threads} thread(s)")

    results = {}
    for arch in archs:
        lr = args.lr or SETTINGS["lr"]
        gensim_model, gensim_seconds = train_gensim(sentences, arch, epochs, args.seed, lr)
        extra = {"batch_size": args.batch_size} if args.batch_size else {}
        bundle, qkv_seconds = train_qkv(
            corpus, arch, epochs, args.seed, args.device, args.threads, work / arch, lr, **extra
        )
        ours = evaluate_analogies(*qkv_vectors(bundle), read_analogies(questions))
        wv = gensim_model.wv
        theirs = evaluate_analogies(wv.vectors, list(wv.index_to_key), read_analogies(questions))
        gensim_own, _ = wv.evaluate_word_analogies(questions, restrict_vocab=30_000)
        speed = {"qkv": n_words * epochs / qkv_seconds, "gensim": n_words * epochs / gensim_seconds}
        results[arch] = {"qkv": ours, "gensim": theirs, "gensim_own_evaluator": gensim_own, "words_per_s": speed}
        if arch == "skipgram":
            Path(args.map).parent.mkdir(parents=True, exist_ok=True)
            draw_map(bundle, Path(args.map))

    print(f"\n{'':8}{'':7}{'accuracy':>10}{'answered':>10}{'words/s':>11}")
    for arch, r in results.items():
        for tool in ("gensim", "qkv"):
            res = r[tool]
            print(f"{arch:8}{tool:7}{100 * res.accuracy:9.2f}%{res.answered:10,}{r['words_per_s'][tool]:11,.0f}")
        gap = 100 * (r["qkv"].accuracy - r["gensim"].accuracy)
        ratio = r["words_per_s"]["qkv"] / r["words_per_s"]["gensim"]
        own = 100 * r["gensim_own_evaluator"]
        print(f"{arch:8}qkv - gensim: {gap:+.2f} points (target within 1); speed ratio {ratio:.2f}x (target >= 0.5x)")
        print(f"{'':8}(gensim's own evaluator on gensim's vectors: {own:.2f}%)")
    print("\nper section (correct / answered):")
    names = [s.name for s in next(iter(results.values()))["qkv"].sections]
    header = "".join(f"{arch[:5] + ' ' + tool:>16}" for arch in results for tool in ("gensim", "qkv"))
    print(f"{'section':28}{header}")
    for k, name in enumerate(names):
        cells = ""
        for r in results.values():
            for tool in ("gensim", "qkv"):
                s = r[tool].sections[k]
                cells += f"{f'{s.correct}/{s.answered} {100 * s.accuracy:.1f}%':>16}"
        print(f"{name:28}{cells}")
    print(f"\nPCA map of qkv's skip-gram vectors: {args.map}" if "skipgram" in results else "")
    if args.json:
        rows = {
            arch: {
                "qkv": r["qkv"].to_dict(),
                "gensim": r["gensim"].to_dict(),
                "gensim_own_evaluator": r["gensim_own_evaluator"],
                "words_per_s": r["words_per_s"],
            }
            for arch, r in results.items()
        }
        Path(args.json).write_text(json.dumps({"corpus": sources, "words": n_words, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
