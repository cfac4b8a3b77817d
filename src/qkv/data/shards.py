"""Token shards: a prepared corpus on disk as files of token ids, read through read-only memory maps.

    DIR/
      manifest.json        what the folder holds: the source, the tokenizer, the dtype, the token count, the
                           train/validation split, and every shard's token count and sha256
      tokenizer.json       the tokenizer that made the ids
      shard-000000.bin     token ids, one after another, little-endian uint16 when the vocabulary has at most
      shard-000001.bin     65,536 entries (2 bytes a token), else uint32; each shard continues the one before

The shards are one sequence of ``tokens`` ids, exactly ``tokenizer.encode(text)`` of the source's whole
text. They are mapped read-only (``mmap``) for ranges (``shards[a:b]``), and each batch's windows are read
from the files with ``pread`` straight into the batch, so a corpus of any size costs the memory of a batch:
the ids are never loaded, nor copied to int64 as a whole, and the operating system's file cache, not the
process, holds the pages read. (Gathering windows from the map instead made every window map about a
megabyte of file pages into the process, as the kernel maps whole large page-cache folios on a fault:
training from 1 GB took 1.5x the memory of training from 1 MB. Where ``os.preadv`` is missing, the map is
read and its pages are handed back every :data:`RELEASE_WINDOWS` windows.)

Opening checks that each shard's size matches the manifest and that its largest id (recorded by the
writer) is inside the tokenizer's vocabulary; loading the tokenizer checks its sha256 against the manifest,
so a swapped tokenizer.json cannot train on ids it did not make. All of this is cheap: :meth:`TokenShards.verify`
also checks the shards' sha256 checksums (reads everything).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO, TypeGuard, cast

import numpy as np
import torch

from qkv.errors import QkvError
from qkv.io import read_json
from qkv.tokenizers import Tokenizer, load_tokenizer

MANIFEST_FILE = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
FORMAT = "qkv-token-shards"
FORMAT_VERSION = 1

SHARD_TOKENS = 100_000_000
"""Tokens per shard file (the last one holds the rest): 200 MB of uint16."""

MIN_SHARD_TOKENS = 1_000_000
"""The smallest ``--shard-tokens`` :func:`~qkv.data.prepare.prepare` takes (2 MB of uint16 a file): smaller shards
only multiply the files (``--shard-tokens 1`` wrote one file per token)."""

RELEASE_WINDOWS = 4096
"""Without ``os.preadv``: after reading this many windows from the map, the pages they touched are released
from the process (not from the file cache)."""

_PREAD = hasattr(os, "preadv")
"""Read windows with ``os.preadv`` (POSIX); else gather them from the memory maps."""

_HASH_BLOCK = 1 << 22


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in 16 bits, else uint32."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def tokenizer_sha256(tokenizer: Tokenizer) -> str:
    """The sha256 the manifest records for the tokenizer: of its JSON form, keys sorted."""
    return hashlib.sha256(json.dumps(tokenizer.to_dict(), sort_keys=True).encode("utf-8")).hexdigest()


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.bin"


def write_bytes(file: BinaryIO, data: memoryview) -> None:
    """The one place shard bytes reach the disk (a test makes it raise ENOSPC to simulate a full disk)."""
    file.write(data)


class ShardWriter:
    """Appends token ids to numbered shard files in ``folder``, starting a new file every ``shard_tokens``
    ids, and hashes them on the way. :meth:`close` returns the manifest's list of shards, each with its
    token count, sha256 and largest id (``max_id``, -1 for none), which readers check against the vocabulary."""

    def __init__(self, folder: Path, dtype: np.dtype, shard_tokens: int = SHARD_TOKENS) -> None:
        if shard_tokens < 1:
            raise QkvError(f"shard_tokens must be at least 1, got {shard_tokens}: use e.g. {SHARD_TOKENS:,}")
        self.folder, self.dtype, self.shard_tokens = Path(folder), np.dtype(dtype), shard_tokens
        self.shards: list[dict[str, Any]] = []
        self.file: BinaryIO | None = None
        self.count = 0  # ids in the open shard
        self.tokens = 0  # ids written in all
        self.max_id = -1  # the largest id in the open shard
        self.digest = hashlib.sha256()

    def write(self, ids: np.ndarray) -> None:
        ids = np.ascontiguousarray(ids, dtype=self.dtype)
        while len(ids):
            if self.file is None:
                self.file = open(self.folder / shard_name(len(self.shards)), "wb")  # noqa: SIM115
            take = ids[: self.shard_tokens - self.count]
            data = take.data.cast("B")  # the array's own buffer, as bytes
            write_bytes(self.file, data)
            self.digest.update(data)
            if len(take):
                self.max_id = max(self.max_id, int(take.max()))
            self.count += len(take)
            self.tokens += len(take)
            ids = ids[len(take) :]
            if self.count == self.shard_tokens:
                self._finish_shard()

    def _finish_shard(self) -> None:
        assert self.file is not None
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        self.shards.append(
            {
                "file": shard_name(len(self.shards)),
                "tokens": self.count,
                "sha256": self.digest.hexdigest(),
                "max_id": self.max_id,
            }
        )
        self.file, self.count, self.max_id, self.digest = None, 0, -1, hashlib.sha256()

    def close(self) -> list[dict[str, Any]]:
        if self.file is not None:
            self._finish_shard()
        return self.shards

    def abort(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


# -------------------------------------------------------------------------------------------- reading


def is_prepared(path: str | Path | Sequence[str | Path] | None) -> TypeGuard[str | Path]:
    """True when ``path`` is a folder written by ``qkv prepare`` (it has a manifest.json)."""
    if path is None or isinstance(path, list | tuple):  # no data, or several files: not one folder
        return False
    return (Path(cast("str | Path", path)) / MANIFEST_FILE).is_file()


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """The folder's manifest, checked for the fields a reader needs."""
    path = Path(folder) / MANIFEST_FILE
    manifest = read_json(path, what="prepared-data manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise QkvError(f"{path} is not a qkv prepared-data manifest: give a folder written by `qkv prepare`")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise QkvError(
            f"{path} has format_version {manifest.get('format_version')!r}, this qkv reads {FORMAT_VERSION}: "
            "prepare the data again with this qkv"
        )
    try:
        shards = manifest["shards"]
        counted = sum(int(s["tokens"]) for s in shards)
        ok = (
            counted == manifest["tokens"]
            and manifest["dtype"] in ("uint16", "uint32")
            and all(isinstance(s["file"], str) and "/" not in s["file"] for s in shards)
        )
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise QkvError(f"{path} is damaged (its shard list does not add up): prepare the data again")
    return manifest


def load_prepared_tokenizer(folder: str | Path, manifest: dict[str, Any]) -> Tokenizer:
    """The folder's tokenizer.json, checked against the manifest: the same sha256 and vocabulary size as the
    tokenizer that encoded the shards (a QkvError otherwise: another tokenizer would read other words)."""
    path = Path(folder) / TOKENIZER_FILE
    tokenizer = load_tokenizer(path)
    held = manifest.get("tokenizer", {})
    if held.get("sha256") not in (None, tokenizer_sha256(tokenizer)) or held.get("vocab_size") not in (
        None,
        tokenizer.vocab_size,
    ):
        raise QkvError(
            f"{path} is not the tokenizer the shards were encoded with (its sha256 differs from the one in "
            f"{MANIFEST_FILE}): put the original back, or prepare the data again with this tokenizer"
        )
    return tokenizer


def prepared_tokenizer_settings(path: str | Path | None) -> dict[str, Any]:
    """``{"tokenizer": kind, "vocab_size": requested size}`` of a prepared folder; {} for anything else."""
    if not is_prepared(path):
        return {}
    tokenizer = read_manifest(path)["tokenizer"]
    return {"tokenizer": tokenizer["kind"], "vocab_size": tokenizer.get("requested_vocab_size")}


class TokenShards:
    """A prepared folder's token ids as one read-only sequence, backed by memory maps of its shards."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder)
        self.dtype = np.dtype("<u2" if self.manifest["dtype"] == "uint16" else "<u4")
        self.arrays: list[np.ndarray] = []
        self._maps: list[mmap.mmap] = []
        self._files: list[BinaryIO] = []
        for shard in self.manifest["shards"]:
            path = self.folder / shard["file"]
            expected = int(shard["tokens"]) * self.dtype.itemsize
            size = path.stat().st_size if path.is_file() else None
            if size != expected:
                found = "is missing" if size is None else f"has {size:,} bytes"
                raise QkvError(
                    f"shard {path} {found} but the manifest says {expected:,} bytes ({shard['tokens']:,} "
                    f"{self.manifest['dtype']} tokens): the folder is damaged or incomplete; prepare the data again"
                )
            self._check_ids(f"shard {path}", shard.get("max_id"))
            file = open(path, "rb", buffering=0)  # noqa: SIM115 - kept open for pread, closed with the object
            self._files.append(file)
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_RANDOM"):
                mapped.madvise(mmap.MADV_RANDOM)  # windows are read at random: no read-ahead
            self._maps.append(mapped)
            self.arrays.append(np.frombuffer(mapped, dtype=self.dtype))  # read only, like the map
        self.ends = np.cumsum([len(a) for a in self.arrays], dtype=np.int64)  # where each shard stops
        self._windows_read = 0

    @property
    def vocab_size(self) -> int | None:
        """The vocabulary size of the tokenizer that made the ids (None in a manifest that lacks it)."""
        size = self.manifest.get("tokenizer", {}).get("vocab_size")
        return size if isinstance(size, int) else None

    def _check_ids(self, where: str, max_id: Any) -> None:
        """QkvError when an id (the manifest's largest of a shard, or of a batch read) is past the vocabulary."""
        if isinstance(max_id, int) and self.vocab_size is not None and max_id >= self.vocab_size:
            raise QkvError(
                f"{where} holds token id {max_id:,}, beyond the tokenizer's {self.vocab_size:,} entries: the "
                "shard or the manifest was changed; check with `qkv prepare ... --verify`, or prepare the data again"
            )

    @property
    def tokenizer_path(self) -> Path:
        return self.folder / TOKENIZER_FILE

    def tokenizer(self) -> Tokenizer:
        """The tokenizer that made the ids, checked against the manifest (:func:`load_prepared_tokenizer`)."""
        return load_prepared_tokenizer(self.folder, self.manifest)

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def read(self, start: int, stop: int) -> np.ndarray:
        """Ids ``start`` up to ``stop`` as an array in the shards' dtype (a view when inside one shard)."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"range {start}:{stop} is outside 0:{len(self)}")
        shard = int(np.searchsorted(self.ends, start, side="right"))
        parts = []
        while start < stop:
            begin = int(self.ends[shard - 1]) if shard else 0
            end = min(stop, int(self.ends[shard]))
            parts.append(self.arrays[shard][start - begin : end - begin])
            start, shard = end, shard + 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.empty(0, self.dtype)

    def __getitem__(self, index: slice) -> torch.Tensor:
        """``shards[a:b]``: those ids as an int64 tensor (a copy: for small ranges)."""
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("TokenShards takes a slice with step 1, e.g. shards[100:200]")
        start, stop, _ = index.indices(len(self))
        return torch.from_numpy(self.read(start, max(start, stop)).astype(np.int64))

    def windows(self, starts: torch.Tensor, length: int) -> torch.Tensor:
        """The windows ``ids[s : s + length]`` for every start ``s``, as one int64 tensor (B, length)."""
        if not _PREAD:
            out = np.empty((len(starts), length), dtype=np.int64)
            for row, start in enumerate(starts.tolist()):
                out[row] = self.read(start, start + length)
            self._windows_read += len(starts)
            if self._windows_read >= RELEASE_WINDOWS:
                self.release()
        else:
            rows = np.empty((len(starts), length), dtype=self.dtype)  # (B, length) in the shards' dtype
            for row, start in enumerate(starts.tolist()):
                self._pread(rows[row], start)
            out = rows.astype(np.int64)
        if out.size:  # cheap next to the model: a changed shard is named here, not an IndexError in W_E
            self._check_ids(f"a shard of {self.folder}", int(out.max()))
        return torch.from_numpy(out)

    def _pread(self, buffer: np.ndarray, start: int) -> None:
        """Fill ``buffer`` with ids ``start`` up to ``start + len(buffer)``, read from the shard files."""
        stop = start + len(buffer)
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"range {start}:{stop} is outside 0:{len(self)}")
        shard, filled = int(np.searchsorted(self.ends, start, side="right")), 0
        while start < stop:
            begin = int(self.ends[shard - 1]) if shard else 0
            end = min(stop, int(self.ends[shard]))
            part = buffer[filled : filled + end - start]
            got = os.preadv(self._files[shard].fileno(), [part.data], (start - begin) * self.dtype.itemsize)
            if got != part.nbytes:
                raise QkvError(
                    f"shard {self._files[shard].name} ended before token {end - begin:,}: it changed after it was "
                    "opened; prepare the data again"
                )
            filled, start, shard = filled + end - start, end, shard + 1

    def release(self) -> None:
        """Drop the pages read so far from this process's memory (the OS keeps them in its file cache)."""
        self._windows_read = 0
        if hasattr(mmap, "MADV_DONTNEED"):
            for mapped in self._maps:
                mapped.madvise(mmap.MADV_DONTNEED)

    def verify(self) -> None:
        """Check the tokenizer and every shard's sha256 against the manifest; a mismatch is a QkvError naming
        the file."""
        if self.manifest.get("tokenizer", {}).get("sha256"):  # every manifest qkv prepare writes has it
            self.tokenizer()
        for shard in self.manifest["shards"]:
            path = self.folder / shard["file"]
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                while block := f.read(_HASH_BLOCK):
                    digest.update(block)
            if digest.hexdigest() != shard["sha256"]:
                raise QkvError(
                    f"shard {path} does not match its sha256 in the manifest: the file changed or is damaged; "
                    "prepare the data again"
                )

    def __repr__(self) -> str:
        return f"TokenShards({str(self.folder)!r}, tokens={len(self):,}, shards={len(self.arrays)}, {self.dtype.name})"
