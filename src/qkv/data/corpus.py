"""Text corpora in memory: the raw text a language model learns from, before the tokenizer turns it into
tokens. For corpora of any size, prepare them instead (:mod:`qkv.data.prepare`): nothing is held whole.

:func:`load_corpus` accepts what a user types after ``--data`` (see :func:`~qkv.data.sources.open_source`):

- nothing, ``"pydoc"`` or ``"builtin"``: the built-in corpus (Python's own documentation, no download);
- a text file: read as UTF-8 (a missing, empty, binary or non-UTF-8 file is a QkvError naming the problem);
- a folder: every ``*.txt`` file under it (and ``.jsonl``, ``.parquet``, compressed ones), recursively, in
  path order, joined with a blank line; empty files are left out;
- a glob, JSON lines, Parquet, compressed files, ``hf:DATASET``;
- a name from :data:`~qkv.data.download.KNOWN_CORPORA` (``"tinyshakespeare"``): downloaded once, cached.

Names are checked before paths, so a local file called ``pydoc`` is given as ``./pydoc``. A
:class:`pathlib.Path` is always taken as a path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qkv.data.sources import BUILTIN_ALIASES, open_source

__all__ = ["BUILTIN_ALIASES", "Corpus", "load_corpus"]


@dataclass
class Corpus:
    """A loaded text: ``text`` itself, a short ``name`` for logs ("pydoc", "tinyshakespeare", a file's
    stem), and ``source`` saying where it came from (a path, a URL and cache path, or the built-in's origin).
    """

    text: str
    name: str
    source: str

    def __repr__(self) -> str:  # the text can be megabytes: show its size instead
        return f"Corpus(name={self.name!r}, source={self.source!r}, chars={len(self.text)})"


def load_corpus(data: str | Path | None, *, text_field: str = "text") -> Corpus:
    """Load the corpus that ``data`` names into memory (see the module docstring)."""
    source = open_source(data, text_field=text_field)
    return Corpus(text=source.read_text(), name=source.name, source=source.description)
