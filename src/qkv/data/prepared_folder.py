"""A prepared folder: what :func:`~qkv.data.prepare.prepare` hands back, and its ``--out`` on disk.

Before preparing, :func:`existing` says whether ``out`` is free, already holds this very preparation (reused,
once its shards and tokenizer are checked against the manifest) or holds something else (refused). After,
:func:`publish` renames the finished hidden work folder to ``out`` in one step, taking another process's result
when it got there first with the same data; :func:`write_error` turns a failed write into the message to fix it.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qkv.data.shards import MANIFEST_FILE, TokenShards, load_prepared_tokenizer, read_manifest
from qkv.errors import QkvError
from qkv.tokenizers import Tokenizer


@dataclass
class PreparedData:
    """A prepared folder: where it is, its manifest, and whether an earlier preparation was reused."""

    folder: Path
    manifest: dict[str, Any]
    reused: bool = False

    def shards(self) -> TokenShards:
        return TokenShards(self.folder)

    def tokenizer(self) -> Tokenizer:
        """The tokenizer that made the shards, checked against the manifest's sha256."""
        return load_prepared_tokenizer(self.folder, self.manifest)


def existing(out: Path, recipe: dict[str, Any]) -> PreparedData | None:
    """The preparation already in ``out`` if it is this one; None if ``out`` is free; else a QkvError."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise QkvError(f"--out {out} is a file: give a folder for the prepared data")
    if not (out / MANIFEST_FILE).is_file():
        if any(out.iterdir()):
            raise QkvError(f"--out {out} is not empty and holds no prepared data: give a new or empty folder")
        return None
    manifest = read_manifest(out)
    if manifest.get("recipe") != recipe:
        held = f"{manifest['source']['name']} with the {manifest['tokenizer']['kind']} tokenizer"
        raise QkvError(
            f"--out {out} already holds a different preparation ({held}): choose another --out, or delete {out} "
            "to prepare it again"
        )
    TokenShards(out)  # the shards are all there, with the sizes and id ranges the manifest says
    load_prepared_tokenizer(out, manifest)  # and the tokenizer is the one that made them
    return PreparedData(out, manifest, reused=True)


def publish(work: Path, out: Path, recipe: dict[str, Any]) -> PreparedData:
    """Rename the finished folder to ``out``; if another process got there first with the same data, use its."""
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    try:
        work.rename(out)
    except OSError:
        found = existing(out, recipe)
        if found is None:
            raise
        return found
    return PreparedData(out, read_manifest(out))


def write_error(error: OSError, out: Path, work: Path) -> QkvError:
    """The QkvError for a write into the work folder that failed: a full disk, or the file it could not write."""
    if error.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return QkvError(
            f"the disk filled up while writing the prepared data for {out}; nothing was kept: free some space "
            f"on {out.resolve().parent} or choose another --out"
        )
    where = error.filename or work
    return QkvError(f"cannot write {where} ({error.strerror or error}); nothing was kept: check the folder for --out")
