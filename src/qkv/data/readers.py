"""Readers for each kind of input file: the documents inside it, streamed in blocks, never whole.

- text (``.txt``, or any file named directly): one document, decoded as UTF-8 in blocks of
  :data:`BLOCK_BYTES` (a leading byte-order mark is dropped, line endings are kept as they are);
- JSON lines (``.jsonl``, ``.ndjson``): one document per line, the string under the text field;
- Parquet (``.parquet``, needs ``pyarrow``): one document per row, the string column named by the text field;
- the text and JSON-lines kinds may be compressed: ``.gz``, ``.bz2``, ``.xz``, and ``.zst`` (``zstandard``).

Each reader yields documents; a document is an iterator of ``(text, position)`` pairs, where
``position`` counts the bytes of the file read so far (compressed bytes for a compressed file), for
progress. Problems are :class:`QkvError` sentences that name the file, the line where there is one,
and the fix.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import io
import json
import lzma
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from qkv.errors import QkvError

BLOCK_BYTES = 1 << 20
"""Text files are read and decoded this many bytes at a time."""

COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")
TEXT_SUFFIXES = (".txt",)
JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
DATA_EXTRA = "pip install 'qkv[data]'"

Document = Iterator[tuple[str, int]]


@dataclass(frozen=True)
class InputFile:
    """One file of a source: its path, format ("text", "jsonl" or "parquet"), compression suffix or None,
    and its size and modification time (which, with the path, identify it for the prepared cache)."""

    path: Path
    format: str
    compression: str | None
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path, *, named: bool) -> InputFile | None:
        """The input that ``path`` is, judged by its suffixes; None for a file a folder scan should skip.
        A file the user ``named`` directly is text unless its suffixes say otherwise."""
        suffixes = [s.lower() for s in path.suffixes[-2:]]
        compression = suffixes.pop() if suffixes and suffixes[-1] in COMPRESSIONS else None
        inner = suffixes[-1] if suffixes else ""
        if inner in PARQUET_SUFFIXES and compression is None:
            kind = "parquet"
        elif inner in JSONL_SUFFIXES:
            kind = "jsonl"
        elif inner in TEXT_SUFFIXES or named:
            kind = "text"
        else:
            return None
        stat = path.stat()
        return cls(path, kind, compression, stat.st_size, stat.st_mtime_ns)

    def documents(self, text_field: str) -> Iterator[Document]:
        if self.format == "parquet":
            return _parquet_documents(self, text_field)
        if self.format == "jsonl":
            return _jsonl_documents(self, text_field)
        return iter([_text_blocks(self)])


# ------------------------------------------------------------------------------------ compressed files


class _ZstdReader(io.RawIOBase):
    """A zstd stream (one or more frames) as a raw file; raises EOFError when the last frame is cut short,
    as gzip, bz2 and lzma do (zstandard's own stream reader returns the partial data silently)."""

    def __init__(self, raw: BinaryIO) -> None:
        import zstandard

        self.raw, self.zstd = raw, zstandard
        self.decoder = zstandard.ZstdDecompressor().decompressobj()
        self.pending, self.in_frame = b"", False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.pending:
            chunk = self.raw.read(BLOCK_BYTES)
            if not chunk:
                if self.in_frame:
                    raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                return 0
            while chunk:
                try:
                    self.pending += self.decoder.decompress(chunk)
                except self.zstd.ZstdError as error:
                    raise OSError(str(error)) from None
                self.in_frame = not self.decoder.eof
                chunk = self.decoder.unused_data if self.decoder.eof else b""
                if self.decoder.eof:  # the next frame, if any, needs a fresh decoder
                    self.decoder = self.zstd.ZstdDecompressor().decompressobj()
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n


def _open(file: InputFile) -> tuple[io.BufferedIOBase, BinaryIO]:
    """``(stream, raw)``: the decompressed bytes to read, and the file on disk (its position is progress)."""
    try:
        raw = open(file.path, "rb")  # noqa: SIM115 (closed by the caller)
    except OSError as error:
        raise QkvError(
            f"cannot read {file.path} ({error.strerror or error}): check the file and its permissions"
        ) from None
    if file.compression == ".gz":
        return gzip.GzipFile(fileobj=raw), raw
    if file.compression == ".bz2":
        return bz2.BZ2File(raw), raw
    if file.compression == ".xz":
        return lzma.LZMAFile(raw), raw
    if file.compression == ".zst":
        try:
            return io.BufferedReader(_ZstdReader(raw), BLOCK_BYTES), raw
        except ImportError:
            raw.close()
            raise QkvError(f"{file.path} is zstd-compressed, which needs the zstandard package: {DATA_EXTRA}") from None
    return raw, raw


def _damaged(file: InputFile, error: BaseException) -> QkvError:
    if isinstance(error, EOFError):
        return QkvError(
            f"compressed file {file.path} is truncated (it ends before its compressed data does): "
            "copy or download it again"
        )
    reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return QkvError(f"compressed file {file.path} is damaged ({reason}): copy or download it again")


_READ_ERRORS = (EOFError, OSError, zlib.error, lzma.LZMAError)


# ---------------------------------------------------------------------------------------------- text


def _text_blocks(file: InputFile) -> Document:
    """The file's text in blocks: UTF-8 decoded incrementally, so a character split between two blocks is
    whole in one of them. Binary content and invalid UTF-8 are QkvErrors naming the byte and the line."""
    stream, raw = _open(file)
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = lines = 0  # bytes and newlines of the decompressed file before this block
    with raw, stream:
        while True:
            try:
                data = stream.read(BLOCK_BYTES)
            except _READ_ERRORS as error:
                if file.compression is None:
                    raise QkvError(f"cannot read corpus file {file.path} ({error}): check the file") from None
                raise _damaged(file, error) from None
            if offset == 0 and b"\x00" in data[:8192]:
                if file.compression is not None:
                    raise QkvError(
                        f"corpus file {file.path} holds binary data once decompressed (NUL bytes), not text: give "
                        "a compressed text file; an archive (.tar.gz, ...) must be unpacked first (give the folder)"
                    )
                raise QkvError(
                    f"corpus file {file.path} looks binary (it contains NUL bytes): give a plain UTF-8 text file"
                )
            held = decoder.getstate()[0]  # bytes of a character the last block cut in two
            try:
                text = decoder.decode(data, final=not data)
            except UnicodeDecodeError as error:
                raise _not_utf8(file, held + data, error.start, offset - len(held), lines) from None
            if offset == 0 and text.startswith("\ufeff"):
                text = text[1:]  # a byte-order mark is not text
            offset += len(data)
            lines += data.count(b"\n")
            yield text, raw.tell()
            if not data:
                return


_DECOMPRESS = {".gz": "zcat", ".bz2": "bzcat", ".xz": "xzcat", ".zst": "zstdcat"}


def _not_utf8(file: InputFile, data: bytes, at: int, base: int, lines: int) -> QkvError:
    """Invalid UTF-8: where, and the command that converts the file (a compressed file is converted after
    decompressing it: iconv on the compressed bytes would only garble them)."""
    line = lines + data[:at].count(b"\n") + 1
    where = f"byte 0x{data[at]:02x} at offset {base + at} (line {line})"
    name = file.path.name
    if file.compression is None:
        return QkvError(
            f"corpus file {file.path} is not valid UTF-8: {where}; convert it, e.g. `iconv -f latin1 -t utf-8 {name}`"
        )
    text = name[: -len(file.compression)]
    return QkvError(
        f"corpus file {file.path} does not hold UTF-8 text once decompressed: {where}; if it is text in another "
        f"encoding, convert it, e.g. `{_DECOMPRESS[file.compression]} {name} | iconv -f latin1 -t utf-8 > {text}`"
    )


# --------------------------------------------------------------------------------------- JSON lines


def _jsonl_documents(file: InputFile, field: str) -> Iterator[Document]:
    """One document per line: the string under ``field``. Blank lines and empty or null texts are skipped;
    a line that is not a JSON object with that field is a QkvError naming the file and the line."""
    stream, raw = _open(file)
    with raw, stream:
        number = 0
        try:
            for number, line in enumerate(stream, 1):  # noqa: B007 (number is read after the loop too)
                if not line.strip():
                    continue
                text = _jsonl_text(file, number, line, field)
                if text:
                    yield iter([(text, raw.tell())])
        except _READ_ERRORS as error:
            if file.compression is None:
                raise QkvError(f"cannot read {file.path} after line {number} ({error}): check the file") from None
            raise _damaged(file, error) from None


def _jsonl_text(file: InputFile, number: int, line: bytes, field: str) -> str | None:
    where = f"{file.path} line {number}"
    try:
        record = json.loads(line)
    except UnicodeDecodeError:
        raise QkvError(f"{where} is not valid UTF-8: convert the file to UTF-8") from None
    except json.JSONDecodeError as error:
        raise QkvError(f"{where} is not valid JSON ({error.msg}): fix or remove that line") from None
    if not isinstance(record, dict):
        raise QkvError(f"{where} is a JSON {type(record).__name__}, not an object: each line must be {{...}}")
    if field not in record:
        fields = ", ".join(map(repr, list(record)[:8])) or "none"
        raise QkvError(f"{where} has no {field!r} field (its fields: {fields}): name the text field with --text-field")
    return document_text(record[field], where, field)


def document_text(value: object, where: str, field: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise QkvError(
        f"{where}: {field!r} holds a {type(value).__name__}, not a string: name the text field with --text-field"
    )


# -------------------------------------------------------------------------------------------- Parquet


def _parquet_documents(file: InputFile, field: str) -> Iterator[Document]:
    """One document per row: the string in column ``field``, read one batch of rows at a time."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise QkvError(f"reading Parquet ({file.path}) needs the pyarrow package: {DATA_EXTRA}") from None
    try:
        parquet = pq.ParquetFile(file.path)
    except Exception as error:  # pyarrow raises its own ArrowInvalid, OSError, ...
        raise QkvError(f"{file.path} is not a readable Parquet file ({error}): check or recreate it") from None
    columns = parquet.schema_arrow.names
    if field not in columns:
        raise QkvError(
            f"{file.path} has no column {field!r} (its columns: {', '.join(map(repr, columns[:8]))}): "
            "name the text column with --text-field"
        )
    total, done = max(parquet.metadata.num_rows, 1), 0
    for batch in parquet.iter_batches(batch_size=1024, columns=[field]):
        done += batch.num_rows
        position = file.size * done // total
        for row, value in enumerate(batch.column(0).to_pylist()):
            text = document_text(value, f"{file.path} row {done - batch.num_rows + row + 1}", field)
            if text:
                yield iter([(text, position)])
