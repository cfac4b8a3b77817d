"""Data at any size: prepare a 1 GB corpus, and show that memory does not grow with the corpus.

    python bench/prepare.py            # 100 MB and 1 GB (about 10 minutes on 2 cores)
    python bench/prepare.py --quick    # 5 MB and 20 MB, a smoke run
    python bench/prepare.py --only train   # just the training memory comparison (about 2 minutes)

Builds corpora from the text at hand (the built-in corpus and ../shared/data: paragraphs shuffled and
repeated, written as a folder of 10 MB .txt files) in a temporary folder that is deleted at the end. Each
step runs as a child process, so its memory is its own: "peak RSS" is the child's peak resident set size as
the kernel reports it (wait4); "peak tree" is the largest proportional set size of the child and its
worker processes together, sampled every 0.2 s from /proc (pages they share counted once).

It prints:
- prepare, char tokenizer, at both sizes: MB/s, tokens/s, seconds, peak memory, and the memory ratio
  (target: about 2 GB at most, not growing with the corpus), with the old in-memory path (one string,
  then int64 ids) at the small size for comparison;
- prepare, BPE 8192 (the issue's configuration) at the small size;
- encoding on every core, interleaved: the word tokenizer in 1 process vs a pool, char in this process vs
  a pool, and the BPE library with its threads off vs on;
- training: peak memory of a few steps from the large prepared corpus vs a 1 MB one with the same
  tokenizer (target: at most 1.10x).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
FILE_BYTES = 10_000_000
PARTS = ["prepare", "bpe", "cores", "train"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 MB and 20 MB instead of 100 MB and 1 GB")
    parser.add_argument("--small-mb", type=float, help="the smaller corpus (default 100, quick 5)")
    parser.add_argument("--large-mb", type=float, help="the larger corpus (default 1000, quick 20)")
    parser.add_argument("--steps", type=int, help="training steps for the memory comparison (default 50, quick 5)")
    parser.add_argument("--tmp", help="where to build the corpora (default: the system's temporary folder)")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=PARTS,
        default=PARTS,
        help="the parts to run (default: all): prepare (char, both sizes, and the old way), bpe, cores "
        "(encoding on every core), train (memory from the large corpus vs 1 MB; prepares the large one quietly)",
    )
    return parser.parse_args(argv)


# ------------------------------------------------------------------------------------------- corpora


def paragraphs() -> list[str]:
    """Paragraphs of every text at hand: the built-in corpus and the shared corpora, when present."""
    from qkv.data import builtin_corpus

    texts = [builtin_corpus()]
    for name in ("tinyshakespeare/input.txt", "eng-fra/eng-fra.txt", "multi30k/train.en", "multi30k/train.de"):
        if (SHARED / name).is_file():
            texts.append((SHARED / name).read_text(encoding="utf-8"))
    found = [p for text in texts for p in text.split("\n\n") if p.strip()]
    # eng-fra and multi30k have no blank lines: cut their long runs into paragraphs of 20 lines
    out = []
    for p in found:
        lines = p.split("\n")
        out.extend("\n".join(lines[i : i + 20]) for i in range(0, len(lines), 20))
    return out


def build_corpus(folder: Path, total_bytes: int, seed: int) -> int:
    """A folder of .txt files of about FILE_BYTES each, holding ``total_bytes`` of shuffled paragraphs."""
    folder.mkdir(parents=True)
    parts = paragraphs()
    rng = random.Random(seed)
    written, index = 0, 0
    while written < total_bytes:
        rng.shuffle(parts)
        with open(folder / f"part-{index:04d}.txt", "w", encoding="utf-8") as f:
            size = 0
            for p in parts:
                data = p + "\n\n"
                f.write(data)
                size += len(data.encode("utf-8"))
                if size >= FILE_BYTES or written + size >= total_bytes:
                    break
        written += size
        index += 1
    return written


# ----------------------------------------------------------------------------------- child processes


def tree_pss_kb(root: int) -> int:
    """Proportional set size of ``root`` and all its descendants, in kB (0 for processes already gone)."""
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
            for task in Path(f"/proc/{pid}/task").iterdir():
                stack.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return total


def child(args: list[str], env: dict[str, str] | None = None) -> dict[str, float]:
    """Run ``python args...``; return seconds, peak RSS (MB) and peak PSS of its process tree (MB)."""
    started = time.perf_counter()
    log = tempfile.TemporaryFile()  # not a pipe: a chatty child must never block on a full one
    process = subprocess.Popen([sys.executable, *args], env={**os.environ, **(env or {})}, stdout=log, stderr=log)
    peak, done = [0], threading.Event()

    def watch() -> None:  # reads /proc only: reaping the child is wait4's job below
        while not done.wait(0.2):
            peak[0] = max(peak[0], tree_pss_kb(process.pid))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    _, status, usage = os.wait4(process.pid, 0)
    done.set()
    process.returncode = os.waitstatus_to_exitcode(status)
    log.seek(0)
    err = log.read().decode(errors="replace")
    watcher.join()
    if process.returncode != 0:
        sys.exit(f"child failed ({' '.join(args)}):\n{err}")
    return {"seconds": time.perf_counter() - started, "rss_mb": usage.ru_maxrss / 1024, "tree_mb": peak[0] / 1024}


def prepare(data: Path, out: Path, *extra: str, env: dict[str, str] | None = None) -> dict[str, float]:
    shutil.rmtree(out, ignore_errors=True)
    measured = child(["-m", "qkv", "prepare", str(data), "--out", str(out), "--quiet", *extra], env)
    manifest = json.loads((out / "manifest.json").read_text())
    text_mb = manifest["source"]["text_bytes"] / 1e6
    encode = manifest["seconds"]["encode"]
    return {
        **measured,
        "text_mb": text_mb,
        "tokens": manifest["tokens"],
        "sample_s": manifest["seconds"]["sample"],
        "encode_s": encode,
        "mb_s": text_mb / measured["seconds"],
        "encode_mb_s": text_mb / encode,
        "tokens_s": manifest["tokens"] / encode,
    }


OLD_WAY = """
import sys
from qkv.data import TokenBatches, load_corpus
from qkv.tokenizers import train_tokenizer
corpus = load_corpus(sys.argv[1])
batches = TokenBatches.from_text(corpus.text, train_tokenizer("char", corpus.text), context_length=64)
print(batches.n_train_tokens)
"""


def row(label: str, m: dict[str, float]) -> None:
    rates = f"{m['mb_s']:7.1f} MB/s overall, encode {m['encode_mb_s']:6.1f} MB/s {m['tokens_s'] / 1e6:6.2f}M tok/s"
    print(
        f"  {label:<22} {m['text_mb']:8.1f} MB  {m['seconds']:7.1f} s (sample {m['sample_s']:5.1f} s)  {rates}  "
        f"peak RSS {m['rss_mb']:7.0f} MB, tree {m['tree_mb']:7.0f} MB",
        flush=True,
    )


def interleaved(label: str, data: Path, root: Path, a: tuple, b: tuple, rounds: int = 2) -> None:
    """Encode seconds of settings ``a`` and ``b`` (name, flags, env), alternating, best of ``rounds``."""
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, flags, env in (a, b):
            m = prepare(data, root / f"p-{name}", *flags, env=env)
            best[name] = min(best.get(name, float("inf")), m["encode_s"])
    print(
        f"  {label:<34} {a[0]} {best[a[0]]:6.1f} s, {b[0]} {best[b[0]]:6.1f} s: "
        f"{best[a[0]] / best[b[0]]:.2f}x faster with {b[0]}",
        flush=True,
    )


def train_peak(data: Path, run: Path, steps: int) -> dict[str, float]:
    args = ["-m", "qkv", "train", "--data", str(data), "--out-dir", str(run), "--steps", str(steps)]
    args += ["--warmup-steps", "1", "--eval-interval", str(steps), "--eval-batches", "20", "--quiet", "--no-samples"]
    return child(args)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    small_mb = args.small_mb or (5 if args.quick else 100)
    large_mb = args.large_mb or (20 if args.quick else 1000)
    steps = args.steps or (5 if args.quick else 50)
    side_mb = 2 if args.quick else 20  # the corpus of the side-by-side parallel comparisons
    bpe_vocab = "1024" if args.quick else "8192"
    root = Path(tempfile.mkdtemp(prefix="qkv-bench-prepare-", dir=args.tmp))
    env_cache = {"QKV_CACHE": str(root / "cache")}
    os.environ.update(env_cache)
    try:
        started = time.perf_counter()
        sizes = {}
        for name, mb, seed in (("small", small_mb, 1), ("large", large_mb, 2), ("side", side_mb, 3)):
            sizes[name] = build_corpus(root / name, int(mb * 1e6), seed)
        tiny = root / "one-mb.txt"
        tiny.write_text((root / "small" / "part-0000.txt").read_text(encoding="utf-8")[:1_000_000], encoding="utf-8")
        print(f"corpora built in {time.perf_counter() - started:.0f} s under {root} (cpu count {os.cpu_count()})")

        if "prepare" in args.only:
            print("\nprepare, char tokenizer (the main job's), 100 MB tokenizer sample:")
            small = prepare(root / "small", root / "p-small")
            row("small corpus", small)
            large = prepare(root / "large", root / "p-large")
            row("large corpus", large)
            print(
                f"  memory large / small: RSS {large['rss_mb'] / small['rss_mb']:.2f}x, tree "
                f"{large['tree_mb'] / small['tree_mb']:.2f}x for {large['text_mb'] / small['text_mb']:.1f}x the text"
            )
            old = child(["-c", OLD_WAY, str(root / "small")])
            print(
                f"  in memory, the old way (small corpus: one string, then int64 ids): {old['seconds']:.1f} s, "
                f"peak RSS {old['rss_mb']:.0f} MB ({old['rss_mb'] / small['rss_mb']:.1f}x the prepared path's)"
            )

        if "bpe" in args.only:
            print(f"\nprepare, BPE with {bpe_vocab} entries (8192: the issue's configuration):")
            bpe_flags = ("--tokenizer", "bpe", "--vocab-size", bpe_vocab)
            row("small corpus", prepare(root / "small", root / "p-bpe", *bpe_flags))

        if "cores" in args.only:
            print(f"\nencoding on every core ({sizes['side'] / 1e6:.0f} MB, best of 2, interleaved):")
            side, word, bpe = root / "side", ["--tokenizer", "word"], ["--tokenizer", "bpe", "--vocab-size", bpe_vocab]
            pool = f"a pool of {os.cpu_count()}"
            interleaved("word", side, root, ("1 process", [*word, "--workers", "1"], None), (pool, word, None))
            interleaved("char", side, root, (pool, ["--workers", str(os.cpu_count())], None), ("1 process", [], None))
            off, on = {"TOKENIZERS_PARALLELISM": "false"}, {"TOKENIZERS_PARALLELISM": "true"}
            interleaved("bpe (the library's threads)", side, root, ("threads off", bpe, off), ("threads on", bpe, on))

        if "train" in args.only:
            print(f"\ntraining, {steps} steps of the default model (gpt-micro), char tokenizer:")
            if not (root / "p-large" / "manifest.json").is_file():
                large = prepare(root / "large", root / "p-large")
            prepare(tiny, root / "p-tiny", "--tokenizer", str(root / "p-large" / "tokenizer.json"))
            one = train_peak(root / "p-tiny", root / "run-tiny", steps)
            big = train_peak(root / "p-large", root / "run-large", steps)
            print(f"  from 1 MB:   peak RSS {one['rss_mb']:6.0f} MB ({one['seconds']:.1f} s)")
            print(f"  from {large['text_mb']:,.0f} MB: peak RSS {big['rss_mb']:6.0f} MB ({big['seconds']:.1f} s)")
            print(f"  ratio: {big['rss_mb'] / one['rss_mb']:.3f}x (target <= 1.10)")
        print(f"\ntotal {time.perf_counter() - started:.0f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
