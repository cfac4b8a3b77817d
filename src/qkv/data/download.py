"""Public corpora that can be downloaded by name, checked by checksum and kept in a local cache.

``fetch("tinyshakespeare")`` returns the path of the cached file. The first call downloads it (with
``urllib``, no extra dependency) to a temporary file, checks its sha256 against the one recorded here and
only then renames it into the cache, so the cache never holds a partial or altered file. Later calls find
the file there, check it again and touch no network.

Without a network the error says where to put a copy made by hand::

    could not download tinyshakespeare from https://... (<reason>): download it yourself and pass
    --data /path/to/file, or put it at ~/.cache/qkv/data/tinyshakespeare.txt

The cache folder is ``$QKV_CACHE`` when that variable is set, else ``~/.cache/qkv/data``.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from qkv.errors import QkvError
from qkv.io import atomic_write

TIMEOUT_SECONDS = 30.0
"""How long a download may wait for the server (connecting, or between two pieces of data)."""

PROGRESS_MIN_BYTES = 1 << 20
"""Downloads at least this large (when the size is known) print a progress line to stderr."""

_CHUNK_BYTES = 1 << 16


@dataclass(frozen=True)
class Source:
    """Where a corpus lives and how to recognise it: its URL, the sha256 of its bytes, the name of the
    file in the cache, and its size in bytes (None when unknown; used for the progress line)."""

    url: str
    sha256: str
    filename: str
    size: int | None = None


KNOWN_CORPORA: dict[str, Source] = {
    # Karpathy's Tiny Shakespeare (char-rnn, nanoGPT's shakespeare_char): ~1.1 MB of public-domain plays.
    "tinyshakespeare": Source(
        url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        filename="tinyshakespeare.txt",
        size=1115394,
    ),
}
"""The corpora ``fetch`` (and ``--data NAME``) know by name."""


def default_cache_dir() -> Path:
    """``$QKV_CACHE`` if set and non-empty, else ``~/.cache/qkv/data``."""
    env = os.environ.get("QKV_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "qkv" / "data"


def sha256_of(path: str | Path) -> str:
    """The hex sha256 of a file's bytes, read in pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(name_or_source: str | Source, *, cache_dir: str | Path | None = None) -> Path:
    """Path of the cached copy of a corpus, downloading and verifying it first if needed.

    ``name_or_source`` is a key of :data:`KNOWN_CORPORA` or a :class:`Source`. A cached file whose sha256
    matches is used as is (no network). Otherwise the file is downloaded into a temporary file beside the
    target, its sha256 checked, and renamed into place. Failures raise :class:`QkvError`: an unknown name,
    a download that fails (with the way to supply the file by hand), or a download with the wrong checksum
    (nothing is cached then).
    """
    if isinstance(name_or_source, Source):
        source, name = name_or_source, Path(name_or_source.filename).stem
    elif name_or_source in KNOWN_CORPORA:
        source, name = KNOWN_CORPORA[name_or_source], name_or_source
    else:
        raise QkvError(
            f"there is no known corpus called {name_or_source!r}: choose one of {', '.join(KNOWN_CORPORA)}, "
            "or pass a local text file"
        )
    target = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = target / source.filename
    stale = ""
    if target.is_file():
        found = sha256_of(target)
        if found == source.sha256:
            return target
        stale = f"; the file already at {target} has sha256 {found}, not {source.sha256}"

    def download(tmp: str) -> None:
        with open(tmp, "wb") as out:
            try:
                with urllib.request.urlopen(source.url, timeout=TIMEOUT_SECONDS) as response:
                    _copy(response, out, name, _total_bytes(response, source))
            except (OSError, ValueError, http.client.HTTPException) as error:  # URLError is an OSError
                raise QkvError(
                    f"could not download {name} from {source.url} ({_reason(error)}{stale}): download it "
                    f"yourself and pass --data /path/to/file, or put it at {target}"
                ) from None
        found = sha256_of(tmp)
        if found != source.sha256:
            raise QkvError(
                f"the download of {name} from {source.url} has sha256 {found}, not the expected "
                f"{source.sha256}, so it was not cached: try again, or download it yourself, check it and "
                "pass --data /path/to/file"
            )

    try:
        atomic_write(target, download)  # the temp file is deleted when download() raises
    except OSError as error:  # the cache folder itself cannot be written
        raise QkvError(
            f"cannot write the download cache {target.parent} ({error.strerror or error}): "
            "set QKV_CACHE to a writable folder"
        ) from None
    return target


def _total_bytes(response: object, source: Source) -> int | None:
    length = getattr(response, "headers", {}).get("Content-Length")
    if length is not None and str(length).isdigit():
        return int(length)
    return source.size


def _copy(response: BinaryIO, out: BinaryIO, name: str, total: int | None) -> None:
    """Copy the response into ``out``, with a progress line on stderr for big files."""
    big = total if total is not None and total >= PROGRESS_MIN_BYTES else 0
    done, last_shown = 0, 0.0
    while block := response.read(_CHUNK_BYTES):
        out.write(block)
        done += len(block)
        now = time.monotonic()
        if big and now - last_shown >= 0.25:
            _progress(name, done, big)
            last_shown = now
    if big:
        _progress(name, done, big)
        print(file=sys.stderr, flush=True)


def _progress(name: str, done: int, total: int) -> None:
    print(
        f"\rdownloading {name}: {done / 2**20:.1f} / {total / 2**20:.1f} MiB ({100 * done / total:.0f}%)",
        end="",
        file=sys.stderr,
        flush=True,
    )


def _reason(error: BaseException) -> str:
    """A short human reason for a failed download: "HTTP 404 Not Found", "timed out", ..."""
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):
        error_reason = error.reason
        return getattr(error_reason, "strerror", None) or str(error_reason)
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__
