"""Parallel text: pairs of a source sentence and its translation, what an encoder-decoder learns from.

The sources' Transformer translates English to French: the encoder reads the source sentence, and the
decoder writes the target sentence one token at a time, starting from ``<bos>`` and attending to the
encoder's output. Training needs the two sentences side by side, pair ``i`` being ``sources[i]`` and its
translation ``targets[i]``.

:func:`load_parallel` reads either layout that translation corpora ship in:

- one TSV file, ``source<TAB>target`` on each line. Columns after the second are ignored: Tatoeba
  exports (and manythings.org's ``eng-fra.txt`` in its newer form) carry a third column with the
  CC-BY attribution of the pair;
- two line-aligned files given as ``(source_path, target_path)``, line ``i`` of one translating line
  ``i`` of the other (Multi30k's ``train.en`` / ``train.de``, most WMT releases).

Lines are split on ``"\\n"`` only (never on the other characters :meth:`str.splitlines` treats as line
breaks, which would shift one file against the other); a final newline is fine and Windows ``"\\r\\n"``
endings are stripped, as is whitespace around each sentence. Anything else a translator cannot learn
from is a :class:`~qkv.errors.QkvError` naming the file and the line, never a silent skip: files of
different lengths, a TSV line without a tab, an empty line, an empty source or target sentence.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from qkv.errors import QkvError
from qkv.io import read_text


@dataclass
class ParallelCorpus:
    """Sentence pairs: ``sources[i]`` translates to ``targets[i]``; ``name`` is short, for logs ("dates",
    a file's stem), and ``source`` says where the pairs came from (the path or paths, or the generator)."""

    sources: list[str]
    targets: list[str]
    name: str
    source: str

    def __post_init__(self) -> None:
        if len(self.sources) != len(self.targets):
            raise QkvError(
                f"parallel corpus {self.name} has {len(self.sources)} sources but {len(self.targets)} targets: "
                "give one target sentence for every source sentence"
            )

    def __len__(self) -> int:
        return len(self.sources)

    def __repr__(self) -> str:  # the sentences can be many: show their number instead
        return f"ParallelCorpus(name={self.name!r}, source={self.source!r}, pairs={len(self)})"


PathLike = str | Path


def load_parallel(path_or_paths: PathLike | Sequence[PathLike]) -> ParallelCorpus:
    """Load sentence pairs from a TSV file (``source<TAB>target`` per line, extra columns ignored) or
    from two line-aligned files given as ``(source_path, target_path)``."""
    if isinstance(path_or_paths, str | Path):
        return _load_tsv(Path(path_or_paths).expanduser())
    paths = list(path_or_paths)
    if len(paths) != 2 or not all(isinstance(p, str | Path) for p in paths):
        raise QkvError(
            f"parallel data must be one TSV file or a pair (source file, target file), got {path_or_paths!r}: "
            "give e.g. pairs.tsv or ('train.en', 'train.fr')"
        )
    return _load_pair(Path(paths[0]).expanduser(), Path(paths[1]).expanduser())


def _lines(path: Path) -> list[str]:
    """The lines of a UTF-8 file: split on "\\n" only, one final newline dropped, "\\r" endings stripped."""
    lines = read_text(path, what="parallel text file").split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _load_tsv(path: Path) -> ParallelCorpus:
    sources, targets = [], []
    for number, line in enumerate(_lines(path), start=1):
        if not line.strip():
            raise QkvError(f"line {number} of {path.name} is empty: remove it or put source<TAB>target on it")
        columns = line.split("\t")
        if len(columns) < 2:
            raise QkvError(f"line {number} of {path.name} has no tab: each line must be source<TAB>target")
        for side, text in (("source", columns[0]), ("target", columns[1])):
            if not text.strip():
                raise QkvError(
                    f"line {number} of {path.name} has an empty {side} sentence: remove the line or fill it in"
                )
        sources.append(columns[0].strip())
        targets.append(columns[1].strip())
    return ParallelCorpus(sources, targets, name=path.stem, source=str(path))


def _load_pair(src_path: Path, tgt_path: Path) -> ParallelCorpus:
    src_lines, tgt_lines = _lines(src_path), _lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise QkvError(
            f"{src_path.name} has {len(src_lines)} lines but {tgt_path.name} has {len(tgt_lines)}: "
            "the files must be line-aligned (line i of one is the translation of line i of the other)"
        )
    for number, (src, tgt) in enumerate(zip(src_lines, tgt_lines, strict=True), start=1):
        for side, path, other, text in (("source", src_path, tgt_path, src), ("target", tgt_path, src_path, tgt)):
            if not text.strip():
                raise QkvError(
                    f"line {number} of {path.name} has an empty {side} sentence: remove it (and line {number} "
                    f"of {other.name}) or fill it in"
                )
    name = src_path.stem if src_path.stem == tgt_path.stem else f"{src_path.stem}-{tgt_path.stem}"
    return ParallelCorpus(
        [s.strip() for s in src_lines],
        [t.strip() for t in tgt_lines],
        name=name,
        source=f"{src_path} + {tgt_path}",
    )


def split_parallel(
    corpus: ParallelCorpus, val_fraction: float = 0.1, seed: int = 0
) -> tuple[ParallelCorpus, ParallelCorpus]:
    """Shuffle the pairs with ``seed`` and split them into ``(train, val)``; the same seed gives the same split.

    The validation part holds ``round(len(corpus) * val_fraction)`` pairs (at least one when
    ``val_fraction > 0``); both parts keep the corpus order among their pairs, the shuffle only decides
    which pairs go where. ``val_fraction=0`` gives an empty validation corpus. Pairs are split by
    position: a sentence that occurs twice in the corpus can land on both sides.
    """
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, int | float) or not 0 <= val_fraction < 1:
        raise QkvError(
            f"val_fraction must be at least 0 and below 1, got {val_fraction!r}: use e.g. 0.1 (or 0 for no validation)"
        )
    n = len(corpus)
    n_val = max(1, round(n * val_fraction)) if val_fraction > 0 else 0
    if n - n_val < 1:
        raise QkvError(
            f"parallel corpus {corpus.name} has {n} pairs, too few to keep {n_val} for validation and train on the "
            "rest: use more pairs or a smaller --val-fraction"
        )
    order = list(range(n))
    random.Random(seed).shuffle(order)
    val_set = set(order[:n_val])
    parts = []
    for split, keep in (("train", lambda i: i not in val_set), ("val", lambda i: i in val_set)):
        indices = [i for i in range(n) if keep(i)]
        parts.append(
            ParallelCorpus(
                [corpus.sources[i] for i in indices],
                [corpus.targets[i] for i in indices],
                name=corpus.name,
                source=f"{corpus.source} ({split}: {len(indices)} of {n} pairs, split seed {seed})",
            )
        )
    return parts[0], parts[1]
