"""Text corpora: the raw text a language model learns from, before the tokenizer turns it into tokens.

:func:`load_corpus` accepts what a user types after ``--data``:

- nothing, ``"pydoc"`` or ``"builtin"``: the built-in corpus (Python's own documentation, no download);
- a text file: read as UTF-8 (a missing, empty, binary or non-UTF-8 file is a QkvError naming the problem);
- a folder: every ``*.txt`` file under it, recursively, in path order, joined with a blank line;
- a name from :data:`~qkv.data.download.KNOWN_CORPORA` (``"tinyshakespeare"``): downloaded once, cached.

Names are checked before paths, so a local file called ``pydoc`` is given as ``./pydoc``. A
:class:`pathlib.Path` is always taken as a path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qkv.data.builtin import BUILTIN_NAME, BUILTIN_SOURCE, builtin_corpus
from qkv.data.download import KNOWN_CORPORA, fetch
from qkv.errors import QkvError
from qkv.io import read_text

BUILTIN_ALIASES = (BUILTIN_NAME, "builtin")
"""The names that select the built-in corpus."""


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


def load_corpus(data: str | Path | None) -> Corpus:
    """Load the corpus that ``data`` names: None or a built-in name, a file, a folder of .txt files, or
    the name of a known downloadable corpus. Anything else is a QkvError listing the choices."""
    if data is None or (isinstance(data, str) and data in BUILTIN_ALIASES):
        return Corpus(text=builtin_corpus(), name=BUILTIN_NAME, source=BUILTIN_SOURCE)
    if isinstance(data, str) and data in KNOWN_CORPORA:
        path = fetch(data)
        source = f"{KNOWN_CORPORA[data].url} (cached at {path})"
        return Corpus(text=read_text(path, what="corpus file"), name=data, source=source)
    path = Path(data).expanduser()
    if path.is_dir():
        return _load_folder(path)
    if path.exists():
        return Corpus(text=read_text(path, what="corpus file"), name=path.stem, source=str(path))
    choices = ", ".join([f"{BUILTIN_NAME} (built in)", *KNOWN_CORPORA])
    raise QkvError(f"{data} does not exist: give a text file, a folder of .txt files, or one of: {choices}")


def _load_folder(folder: Path) -> Corpus:
    """Every ``*.txt`` file under ``folder`` (recursively, sorted by path), joined with a blank line."""
    files = sorted(p for p in folder.rglob("*.txt") if p.is_file())
    if not files:
        raise QkvError(
            f"folder {folder} has no .txt files in it: put the corpus there as .txt files, or give one text file"
        )
    text = "\n\n".join(read_text(p, what="corpus file") for p in files)
    return Corpus(text=text, name=folder.resolve().name, source=str(folder))
