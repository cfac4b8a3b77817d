"""Prepare a corpus once: tokenize it, streaming and on every core, into memory-mappable token shards.

    source ─▶ pieces ─▶ a sample spread over the whole input ─▶ train the tokenizer      (phase "sample")
    source ─▶ pieces ─▶ encode on every core ─▶ shards + tokenizer.json + manifest.json   (phase "encode")

Memory does not grow with the corpus: the text streams through in pieces of about a million characters
(cut where no token can span the cut, so the shards equal one ``encode`` of the whole text: see
:mod:`qkv.data.pieces`), a few pieces are in flight at a time, and the ids go straight to disk. The
tokenizer learns from at most ``sample_mb`` MB of text, taken evenly from the whole input (all of it when
the corpus is smaller). The word tokenizer (Python code) encodes in a pool of processes, one per core; the
char tokenizer encodes with a vectorised table lookup in this process; the BPE library encodes a batch of
pieces on all cores itself.

Nothing is left half-written: everything goes into a hidden folder beside ``out``, which is renamed to
``out`` only once complete; on any error (bad input, a full disk, Ctrl-C) it is deleted, and after a
SIGKILL the next preparation beside it removes it (:mod:`qkv.data.leftovers`). What an ``out`` that exists
already may hold, and the rename, are :mod:`qkv.data.prepared_folder`'s.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import shutil
import signal
import sys
import time
from collections import deque
from collections.abc import Generator, Iterator
from concurrent.futures import ProcessPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from qkv.data.leftovers import OWNER_FILE, die_with_parent, make_work_folder, remove_stale_work_folders
from qkv.data.prepared_folder import PreparedData, existing, publish, write_error
from qkv.data.progress import DataProgress, size_text
from qkv.data.shards import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_FILE,
    MIN_SHARD_TOKENS,
    SHARD_TOKENS,
    TOKENIZER_FILE,
    ShardWriter,
    token_dtype,
    tokenizer_sha256,
)
from qkv.data.sources import DataArg, TextSource, open_source
from qkv.errors import QkvError
from qkv.io import atomic_write_json
from qkv.tokenizers import CharTokenizer, HFTokenizer, Tokenizer, load_tokenizer, train_tokenizer
from qkv.tokenizers.base import MAX_VOCAB_SIZE

SAMPLE_MB = 100.0
"""Default size of the tokenizer's training sample, in MB of text."""

POOL_MIN_BYTES = 8 << 20
"""Smaller inputs are encoded in this process: starting a pool would cost more than it saves."""

KINDS = ("char", "word", "bpe")


def prepare(
    data: DataArg | TextSource,
    out: str | Path,
    *,
    tokenizer: str | Tokenizer = "char",
    vocab_size: int | None = None,
    text_field: str = "text",
    sample_mb: float = SAMPLE_MB,
    val_fraction: float = 0.1,
    workers: int | None = None,
    shard_tokens: int = SHARD_TOKENS,
    quiet: bool = False,
) -> PreparedData:
    """Tokenize ``data`` (anything :func:`~qkv.data.sources.open_source` accepts) into the folder ``out``.

    ``tokenizer`` is a kind to train ("char", "word" or "bpe", with ``vocab_size`` for word/bpe) or a
    tokenizer to use as it is. ``val_fraction`` is recorded as the manifest's split (training can choose
    another). ``workers`` processes encode with char and word tokenizers (default: one per core for word,
    this process for char; BPE encodes on the library's own threads). If ``out`` already holds this very
    preparation (same files, sizes and times, same tokenizer settings) it is reused, not redone; if it
    holds anything else, that is a QkvError.
    """
    _check_settings(tokenizer, vocab_size, sample_mb, val_fraction, workers, shard_tokens)
    source = open_source(data, text_field=text_field)
    if isinstance(tokenizer, Tokenizer):
        settings: dict[str, Any] = {"tokenizer_sha256": tokenizer_sha256(tokenizer)}
    else:
        settings = {"kind": tokenizer, "vocab_size": vocab_size, "sample_mb": float(sample_mb)}
    recipe = {"source": source.identity, "tokenizer": settings, "shard_tokens": shard_tokens}
    out = Path(out).expanduser()
    found = existing(out, recipe)
    if found is not None:
        return found
    remove_stale_work_folders(out)  # and says so, also under quiet: files disappear
    work, owner = out.parent / f".{out.name}.preparing", None
    started = time.perf_counter()
    try:
        work, owner = make_work_folder(out)
        if isinstance(tokenizer, Tokenizer):
            trained, sample_bytes = tokenizer, 0
        else:
            trained, sample_bytes = _train_on_sample(source, tokenizer, vocab_size, sample_mb, quiet=quiet)
        trained.save(work / TOKENIZER_FILE)
        sampled = time.perf_counter()
        stats = _encode(source, trained, work, workers=workers, shard_tokens=shard_tokens, quiet=quiet)
        if stats["unknown"]:  # a warning, not progress: said also under quiet
            print(_unknown_note(trained, stats, given=isinstance(tokenizer, Tokenizer)), file=sys.stderr, flush=True)
        seconds = {"sample": round(sampled - started, 3), "encode": round(time.perf_counter() - sampled, 3)}
        manifest = _manifest(source, trained, stats, recipe, vocab_size, sample_bytes, val_fraction, seconds)
        atomic_write_json(work / MANIFEST_FILE, manifest)
        (work / OWNER_FILE).unlink()  # the lock stays held (the file is open) until the folder is out
        return publish(work, out, recipe)
    except OSError as error:
        raise write_error(error, out, work) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if owner is not None:
            owner.close()


def _manifest(source: TextSource, tokenizer: Tokenizer, stats: dict[str, Any], recipe: dict[str, Any],
              vocab_size: int | None, sample_bytes: int, val_fraction: float,
              seconds: dict[str, float]) -> dict[str, Any]:  # fmt: skip
    """manifest.json of a prepared folder: the source, the tokenizer, the token count and split, the shards,
    the time each phase took and the recipe that made it (what a rerun compares to reuse the folder)."""
    n_train = int(stats["tokens"] * (1.0 - val_fraction))
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "qkv": _version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "source": {"name": source.name, "description": source.description, **stats["text"]},
        "tokenizer": {
            "file": TOKENIZER_FILE,
            "kind": tokenizer.kind,
            "vocab_size": tokenizer.vocab_size,
            "requested_vocab_size": vocab_size,
            "sha256": tokenizer_sha256(tokenizer),
            "sample_bytes": sample_bytes,
        },
        "dtype": token_dtype(tokenizer.vocab_size).name,
        "tokens": stats["tokens"],
        "unknown_tokens": stats["unknown"],
        "split": {"val_fraction": val_fraction, "train_tokens": n_train, "val_tokens": stats["tokens"] - n_train},
        "shards": stats["shards"],
        "seconds": seconds,
        "recipe": recipe,
    }


# ------------------------------------------------------------------------------------- the two phases


def _train_on_sample(
    source: TextSource, kind: str, vocab_size: int | None, sample_mb: float, *, quiet: bool
) -> tuple[Tokenizer, int]:
    """Train a ``kind`` tokenizer on at most ``sample_mb`` MB of the source's text, spread evenly over it."""
    budget = int(sample_mb * 1e6)
    whole = source.text_bound is not None and source.text_bound <= budget
    progress = DataProgress("sample", source.total_bytes, enabled=not quiet, tokens=False)
    counts = {"seen": 0, "kept": 0}

    def sample() -> Iterator[str]:
        for piece, position in source.pieces():
            size = len(piece.encode("utf-8", "surrogatepass"))
            counts["seen"] += size
            if whole:
                keep = True
            elif source.total_bytes:  # keep pace with how far through the input we are
                keep = counts["kept"] < budget * position / source.total_bytes
            elif counts["kept"] >= budget:  # a stream of unknown size: its beginning
                break
            else:
                keep = True
            if keep:
                counts["kept"] += size
                yield piece
            progress.update(position, counts["seen"])
        progress.close()
        if kind == "bpe":
            progress.note("tokenizer: learning the BPE merges from the sample...")

    try:
        tokenizer = train_tokenizer(kind, sample(), vocab_size)
    finally:
        progress.close()
    progress.note(
        f"tokenizer: {kind}, {tokenizer.vocab_size:,} entries, trained on {size_text(counts['kept'])} of text"
        + ("" if whole else f" (a sample of {source.name}, --tokenizer-sample {sample_mb:g})")
    )
    return tokenizer, counts["kept"]


def _encode(
    source: TextSource, tokenizer: Tokenizer, folder: Path, *, workers: int | None, shard_tokens: int, quiet: bool
) -> dict[str, Any]:
    """Encode the whole source into shards in ``folder``; return the counts and checksums for the manifest.

    ``workers=None`` chooses: one process per core for the word tokenizer (Python code), this process alone
    for char (a vectorised table lookup outruns what a pool spends passing text around) and for inputs
    under :data:`POOL_MIN_BYTES`. A number given is used as it is.
    """
    if workers is None:
        small = source.total_bytes is not None and source.total_bytes < POOL_MIN_BYTES
        workers = 1 if small or isinstance(tokenizer, CharTokenizer) else os.cpu_count() or 1
    writer = ShardWriter(folder, token_dtype(tokenizer.vocab_size), shard_tokens)
    progress = DataProgress("encode", source.total_bytes, enabled=not quiet)
    digest = hashlib.sha256()  # of the text itself: the run's data fingerprint
    text_bytes = characters = unknown = 0
    unk = tokenizer.unk_id
    forced: list[int] = []
    encoded = _encoded(source.pieces(forced=forced), tokenizer, workers)
    try:
        for piece, position, ids in encoded:
            data = piece.encode("utf-8", "surrogatepass")
            digest.update(data)
            text_bytes += len(data)
            characters += len(piece)
            writer.write(ids)
            if unk is not None:
                unknown += int(np.count_nonzero(ids == unk))
            progress.update(position, text_bytes, writer.tokens)
        shards = writer.close()
    finally:
        encoded.close()  # stops the worker processes now, also after an error
        writer.abort()
        seconds, mb_s, tokens_s = progress.close()
    progress.note(
        f"encoded {size_text(text_bytes)} into {writer.tokens:,} tokens in {seconds:,.1f}s "
        f"({mb_s:,.1f} MB/s, {tokens_s:,.0f} tokens/s)"
    )
    text = {"text_sha256": digest.hexdigest(), "text_bytes": text_bytes, "characters": characters}
    text = {**text, "forced_cuts": sum(forced)}
    return {"tokens": writer.tokens, "shards": shards, "text": text, "unknown": unknown}


def _unknown_note(tokenizer: Tokenizer, stats: dict[str, Any], *, given: bool) -> str:
    """The note for ids that became ``<unk>``: the model will see <unk> where the text had something else."""
    fix = "train one on this data (--tokenizer char, word or bpe)" if given else "raise --tokenizer-sample"
    return (
        f"note: {stats['unknown']:,} of {stats['tokens']:,} tokens became <unk> (characters or words the "
        f"{tokenizer.kind} tokenizer does not know): the model sees <unk> in their place; {fix} to keep them"
    )


def _encoded(
    pieces: Iterator[tuple[str, int]], tokenizer: Tokenizer, workers: int
) -> Generator[tuple[str, int, np.ndarray], None, None]:
    """``(piece, position, ids)`` in order. BPE: batches through the library's own threads; char and word:
    a pool of ``workers`` processes with a few pieces in flight per process (memory stays bounded)."""
    if isinstance(tokenizer, HFTokenizer):
        batch_size = 4 * (os.cpu_count() or 1)
        while batch := list(islice(pieces, batch_size)):
            encoded = tokenizer.encode_batch([piece for piece, _ in batch])
            for (piece, position), ids in zip(batch, encoded, strict=True):
                yield piece, position, np.asarray(ids, dtype=np.int64)
        return
    if workers <= 1:
        for piece, position in pieces:
            yield piece, position, tokenizer.encode_array(piece)
        return
    dtype = token_dtype(tokenizer.vocab_size)
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    with ProcessPoolExecutor(
        workers, context, initializer=_start_worker, initargs=(tokenizer.to_dict(), dtype, os.getpid())
    ) as pool:
        in_flight: deque = deque()
        try:
            for piece, position in pieces:
                in_flight.append((piece, position, pool.submit(_encode_piece, piece)))
                if len(in_flight) >= 2 * workers:
                    piece, position, future = in_flight.popleft()
                    yield piece, position, future.result()
            while in_flight:
                piece, position, future = in_flight.popleft()
                yield piece, position, future.result()
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise


_worker_state: dict[str, Any] = {}


def _start_worker(tokenizer: dict[str, Any], dtype: np.dtype, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the pool
    die_with_parent(parent)  # a parent killed with SIGKILL takes its workers along
    _worker_state["tokenizer"], _worker_state["dtype"] = load_tokenizer(tokenizer), dtype


def _encode_piece(piece: str) -> np.ndarray:
    return _worker_state["tokenizer"].encode_array(piece).astype(_worker_state["dtype"])


# ------------------------------------------------------------------------------------------ helpers


def _check_settings(
    tokenizer: str | Tokenizer,
    vocab_size: int | None,
    sample_mb: float,
    val_fraction: float,
    workers: int | None,
    shard_tokens: int,
) -> None:
    if not isinstance(tokenizer, Tokenizer):
        if tokenizer not in KINDS:
            raise QkvError(f"--tokenizer {tokenizer!r} is unknown: choose char, word, bpe or a tokenizer.json file")
        if vocab_size is not None and tokenizer == "char":
            raise QkvError("--vocab-size applies to word and bpe tokenizers: drop it or add --tokenizer bpe")
        if vocab_size is not None and not 1 <= vocab_size <= MAX_VOCAB_SIZE:
            raise QkvError(
                f"--vocab-size must be between 1 and {MAX_VOCAB_SIZE:,}, got {vocab_size:,}: GPT-2 uses 50,257; "
                "try e.g. 8000"
            )
    elif tokenizer.kind not in KINDS:
        raise QkvError(
            f"a {tokenizer.kind!r} tokenizer cannot be used to prepare data: only qkv's char, word and bpe "
            "tokenizers are known to encode a text in pieces exactly"
        )
    elif vocab_size is not None:
        raise QkvError("--vocab-size trains a new tokenizer: drop it when giving a tokenizer file")
    if not sample_mb > 0:
        raise QkvError(f"--tokenizer-sample must be above 0 MB, got {sample_mb}: use e.g. {SAMPLE_MB:g}")
    if not 0 <= val_fraction < 1:
        raise QkvError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    if workers is not None and workers < 1:
        raise QkvError(f"--workers must be at least 1, got {workers}")
    if shard_tokens < MIN_SHARD_TOKENS:
        raise QkvError(
            f"--shard-tokens must be at least {MIN_SHARD_TOKENS:,} (smaller shards only multiply the files), got "
            f"{shard_tokens:,}: use e.g. {SHARD_TOKENS:,}"
        )


def _version() -> str:
    from qkv.version import __version__

    return __version__
