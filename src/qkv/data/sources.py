"""Text sources: everything ``--data`` accepts, as one stream of text that is never held whole in memory.

:func:`open_source` accepts:

- nothing, ``"pydoc"`` or ``"builtin"``: the built-in corpus (Python's own documentation);
- a name from :data:`~qkv.data.download.KNOWN_CORPORA` (``"tinyshakespeare"``): downloaded once, cached;
- a file: text (``.txt`` or any other name), JSON lines (``.jsonl``, ``.ndjson``: the string under
  ``text_field`` on each line) or Parquet (``.parquet``: the column ``text_field``), the first two also
  compressed (``.gz``, ``.bz2``, ``.xz``, ``.zst``); see :mod:`qkv.data.readers`;
- a folder: every file of those kinds under it, recursively, in path order;
- a glob such as ``"books/**/*.txt.gz"``, or a list of any of these paths;
- ``hf:NAME[:CONFIG][@SPLIT]`` or ``hf:FOLDER``: a Hugging Face dataset (:mod:`qkv.data.hf_datasets`).

The text of a source is its documents joined by one blank line (``"\\n\\n"``): a text file is one document,
a JSON line or a Parquet row is one. Documents that are empty or only whitespace are left out, so a folder
of files reads as ``"\\n\\n".join(file texts)``, as it always has.
"""

from __future__ import annotations

import glob
import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qkv.data import pieces as pieces_module
from qkv.data.builtin import BUILTIN_NAME, BUILTIN_SOURCE, builtin_corpus
from qkv.data.download import KNOWN_CORPORA, fetch
from qkv.data.hf_datasets import PREFIX as HF_PREFIX
from qkv.data.hf_datasets import DatasetSpec, hf_documents
from qkv.data.pieces import cut_pieces
from qkv.data.readers import BLOCK_BYTES, COMPRESSIONS, Document, InputFile
from qkv.errors import QkvError

BUILTIN_ALIASES = (BUILTIN_NAME, "builtin")
"""The names that select the built-in corpus."""

SEPARATOR = "\n\n"
"""What stands between two documents in a source's text."""

DataArg = str | Path | Sequence[str | Path] | None


@dataclass
class TextSource:
    """One corpus to read: a short ``name`` for logs, a ``description`` of where it comes from,
    ``total_bytes`` (the size on disk of all its files, the 100% of a progress bar; None when unknown),
    ``text_bound`` (at least the size of its text in UTF-8 bytes, when that is known without reading it:
    uncompressed files), and ``identity``, what the prepared cache is keyed on (paths, sizes, times)."""

    name: str
    description: str
    total_bytes: int | None
    text_bound: int | None
    identity: dict[str, Any]
    documents: Callable[[], Iterator[Document]]
    empty: Callable[[], QkvError]  # the error for a source without any text

    def blocks(self) -> Iterator[tuple[str, int]]:
        """The text in blocks ``(text, position)``, documents joined by :data:`SEPARATOR`; ``position``
        counts the input bytes read so far. A source without text raises its QkvError when it is done."""
        started = False  # has any document shown text yet?
        for document in self.documents():
            held: list[tuple[str, int]] = []  # leading whitespace, kept until the document shows text
            shown = False
            for text, position in document:
                if not shown:
                    if not text.strip():
                        held.append((text, position))
                        continue
                    if started:
                        yield SEPARATOR, position
                    started = shown = True
                    yield from held
                yield text, position
        if not started:
            raise self.empty()

    def pieces(self, piece_chars: int | None = None, *, forced: list[int] | None = None) -> Iterator[tuple[str, int]]:
        """The text cut into pieces of about ``piece_chars`` characters (default
        :data:`~qkv.data.pieces.PIECE_CHARS`) where no token can span the cut (:mod:`qkv.data.pieces`)."""
        return cut_pieces(self.blocks(), piece_chars or pieces_module.PIECE_CHARS, forced=forced)

    def read_text(self) -> str:
        """The whole text in memory: for small corpora only."""
        return "".join(text for text, _ in self.blocks())


def open_source(data: DataArg | TextSource, *, text_field: str = "text") -> TextSource:
    """The source that ``data`` names (see the module docstring); anything else is a QkvError listing the
    choices. Names are checked before paths, so a local file called ``pydoc`` is given as ``./pydoc``.
    A :class:`TextSource` is returned as it is."""
    if isinstance(data, TextSource):
        return data
    if data is None or (isinstance(data, str) and data in BUILTIN_ALIASES):
        return _builtin_source()
    if isinstance(data, str) and data.startswith(HF_PREFIX):
        return _hf_source(DatasetSpec.parse(data), text_field)
    if isinstance(data, str) and data in KNOWN_CORPORA:
        path = fetch(data)
        described = f"{KNOWN_CORPORA[data].url} (cached at {path})"
        return _file_source([_input(path, named=True)], text_field, name=data, described=described, one_file=True)
    items = [data] if isinstance(data, (str, Path)) else list(data)
    files = [file for item in items for file in _resolve(item)]
    path = Path(items[0]).expanduser()
    one_file = len(items) == 1 and path.is_file()
    if len(items) > 1:
        name = f"{_stem(files[0].path)}+"
    elif path.is_dir():
        name = path.resolve().name
    else:
        name = _stem(path) if one_file else path.parent.resolve().name  # a glob: its folder's name
    described = " ".join(map(str, items))
    return _file_source(files, text_field, name=name, described=described, one_file=one_file)


# ----------------------------------------------------------------------------------------- the kinds


def _builtin_source() -> TextSource:
    text = builtin_corpus()

    def documents() -> Iterator[Document]:
        chunk = BLOCK_BYTES
        yield iter([(text[i : i + chunk], min(i + chunk, len(text))) for i in range(0, len(text), chunk)])

    data = text.encode("utf-8")
    return TextSource(
        BUILTIN_NAME,
        BUILTIN_SOURCE,
        len(text),
        len(data),
        {"builtin": hashlib.sha256(data).hexdigest()},
        documents,
        lambda: QkvError("the built-in corpus is empty: this Python lacks pydoc_data; pass --data FILE"),
    )


def _hf_source(spec: DatasetSpec, text_field: str) -> TextSource:
    return TextSource(
        Path(spec.name).name or spec.name,
        f"Hugging Face dataset {spec.name}" + (f" ({spec.config})" if spec.config else "") + f", split {spec.split}",
        None,
        None,
        {**spec.identity(), "text_field": text_field},
        lambda: hf_documents(spec, text_field),
        lambda: QkvError(f"dataset {spec.name} has no text under {text_field!r}: name the column with --text-field"),
    )


def _file_source(
    files: list[InputFile], text_field: str, *, name: str, described: str, one_file: bool = True
) -> TextSource:
    def documents() -> Iterator[Document]:
        before = 0  # bytes of the files already read
        for file in files:
            for document in file.documents(text_field):
                yield ((text, before + position) for text, position in document)
            before += file.size

    def empty() -> QkvError:
        if one_file and files[0].format == "text":
            return QkvError(f"corpus file {files[0].path} is empty: give a file with text in it")
        if one_file:
            return QkvError(f"{files[0].path} has no text under {text_field!r}: name the text field with --text-field")
        count = f"its {len(files)} file{'s' * (len(files) != 1)} {'are' if len(files) != 1 else 'is'} empty"
        return QkvError(f"{described} holds no text ({count}): give files with text in them")

    identity: dict[str, Any] = {"files": [[str(f.path.resolve()), f.size, f.mtime_ns] for f in files]}
    if any(f.format != "text" for f in files):
        identity["text_field"] = text_field
    total = sum(f.size for f in files)
    plain = all(f.compression is None and f.format != "parquet" for f in files)
    bound = total + len(SEPARATOR) * len(files) if plain else None
    return TextSource(name, described, total, bound, identity, documents, empty)


# ------------------------------------------------------------------------------------ paths to files


def _resolve(item: str | Path) -> list[InputFile]:
    """The input files one path, folder or glob stands for."""
    path = Path(item).expanduser()
    if path.is_dir():
        return _folder(path)
    if path.exists():
        return [_input(path, named=True)]
    if isinstance(item, str) and any(c in item for c in "*?["):
        matches = sorted(Path(p) for p in glob.glob(str(path), recursive=True))
        files = [f for m in matches for f in (_folder(m) if m.is_dir() else [_input(m, named=True)])]
        if not files:
            raise QkvError(f"{item} matches no files: check the pattern (and the folder it starts from)")
        return files
    choices = ", ".join([f"{BUILTIN_NAME} (built in)", *KNOWN_CORPORA])
    raise QkvError(
        f"{item} does not exist: give a text file, a folder of .txt files, a glob, a .jsonl or .parquet file, "
        f"hf:DATASET, or one of: {choices}"
    )


def _folder(folder: Path) -> list[InputFile]:
    files = [f for p in sorted(folder.rglob("*")) if p.is_file() and (f := InputFile.of(p, named=False))]
    if not files:
        raise QkvError(
            f"folder {folder} has no .txt files in it (nor .jsonl, .parquet or compressed ones): put the "
            "corpus there as .txt files, or give one text file"
        )
    return files


def _stem(path: Path) -> str:
    """A file's name without its suffixes of kind and compression: "book" for book.txt.gz."""
    if path.suffix.lower() in COMPRESSIONS:
        path = path.with_suffix("")
    return path.stem


def _input(path: Path, *, named: bool) -> InputFile:
    try:
        return InputFile.of(path, named=named)  # type: ignore[return-value]  # named files always are one
    except OSError as error:
        raise QkvError(f"cannot read {path} ({error.strerror or error}): check its permissions") from None
