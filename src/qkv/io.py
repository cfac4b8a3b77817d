"""Reading and writing files safely.

Writes are atomic: the bytes go to a temporary file in the same directory, which is then renamed over the
target, so an interrupted write never leaves a half-written checkpoint or config. The writer holds a lock on its
temporary file until the rename; a process killed mid-write (SIGKILL, a power cut) leaves the file unlocked, and
the next write of the same target deletes it. A write that fails (a
read-only folder, a full disk, a path under a file) is a :class:`CannotWrite`: one sentence naming the path,
what the system said and the fix, and still an OSError for callers that add their own context (train names
the last intact checkpoint). Every file qkv writes goes through :func:`writing`. Reads turn the usual
failures (missing file, empty file, invalid UTF-8, invalid JSON) into one :class:`QkvError` sentence that
names the file and the fix.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from qkv.errors import QkvError

try:
    import fcntl
except ImportError:  # Windows: no advisory locks (it refuses to delete a file a live write has open instead)
    fcntl = None  # type: ignore[assignment]  # the module is absent on Windows: None says so


class CannotWrite(QkvError, OSError):
    """A file or folder qkv was asked to write could not be written: a QkvError (one line, exit code 2) that
    keeps the OSError's errno, strerror and filename."""

    def __init__(self, error: OSError, path: Path) -> None:
        super().__init__(error.errno, error.strerror, error.filename or str(path))
        reason = error.strerror or str(error)
        if error.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            fix = "free some space or write somewhere else"
        else:
            fix = f"choose a folder you can write to (is {_first_missing_folder(path)} a folder, and writable?)"
        where = f": {error.filename}" if error.filename and Path(error.filename) != path else ""
        self.message = f"cannot write {path} ({reason}{where}): {fix}"

    def __str__(self) -> str:
        return self.message


def _first_missing_folder(path: Path) -> Path:
    """The nearest existing ancestor of ``path`` (the folder to check), or its parent."""
    for parent in path.absolute().parents:
        if parent.exists():
            return parent
    return path.parent


def check_writable(path: str | Path) -> None:
    """:class:`CannotWrite` now, before a long computation, when ``path`` (a file or a folder, made with its
    parents) could not be created: its nearest existing ancestor is a file or not writable."""
    path = Path(path)
    folder = _first_missing_folder(path)
    if not folder.is_dir():
        raise CannotWrite(OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder)), path)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CannotWrite(OSError(errno.EACCES, os.strerror(errno.EACCES), str(folder)), path)


@contextmanager
def writing(path: str | Path) -> Iterator[Path]:
    """Around any code that writes ``path`` (a file or a folder): an OSError inside becomes :class:`CannotWrite`.

    >>> with writing("out/lens.png") as target:  # doctest: +SKIP
    ...     figure.savefig(target)
    """
    path = Path(path)
    try:
        yield path
    except CannotWrite:
        raise
    except OSError as error:
        raise CannotWrite(error, path) from None


def atomic_write(path: str | Path, write: Callable[[str], object]) -> None:
    """Call ``write(temp_path)`` and then rename the temporary file to ``path``; a failure is :class:`CannotWrite`.
    The temporary files of killed writes of ``path`` are deleted first (:func:`remove_killed_writes`)."""
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_killed_writes(path)
        fd, tmp = tempfile.mkstemp(prefix=_temporary_prefix(path), suffix=".tmp", dir=path.parent)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)  # held until the rename: this write is alive
            write(tmp)
            with open(tmp, "rb+") as written:  # the bytes reach the disk before the rename makes them visible
                os.fsync(written.fileno())
            os.chmod(tmp, 0o644)  # mkstemp makes files private; checkpoints are meant to be shared
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)


def _temporary_prefix(path: Path) -> str:
    return f".{path.name}."


def remove_killed_writes(path: str | Path) -> list[Path]:
    """Delete the temporary files beside ``path`` (``.NAME.*.tmp``) that no live write holds: what writes of it
    killed before their rename left. Returns them. A write still running holds its file's lock and is left alone."""
    path = Path(path)
    return _remove_unlocked(path.parent, glob.escape(_temporary_prefix(path)) + "*.tmp")


def remove_killed_writes_in(folder: str | Path) -> list[Path]:
    """:func:`remove_killed_writes` for every target in ``folder``: each ``.*.tmp`` file no live write holds."""
    return _remove_unlocked(Path(folder), ".*.tmp")


def _remove_unlocked(folder: Path, pattern: str) -> list[Path]:
    if not folder.is_dir():
        return []
    removed = []
    for leftover in folder.glob(pattern):
        try:
            if fcntl is None:  # Windows refuses to delete a file a live write has open
                leftover.unlink()
            else:
                with open(leftover, "rb") as handle:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # taken only if its writer is gone
                    leftover.unlink()
            removed.append(leftover)
        except OSError:  # locked by a live write, removed by another process, a folder, or not ours to read
            continue
    return removed


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def cannot_read(path: str | Path, what: str, reason: str = "permission denied") -> QkvError:
    """The one line for a file or folder this user may not read (chmod 000, another user's private folder)."""
    return QkvError(
        f"cannot read {what} {path} ({reason}): give yourself read access (chmod -R u+rX {path}), or run as the "
        "user who owns it"
    )


def check_readable(path: str | Path, what: str = "") -> None:
    """:func:`cannot_read` when ``path`` exists but this user may not read it (a folder: list and enter it), or
    may not reach it (a folder above it); nothing when it is readable or absent (the caller says "missing")."""
    path = Path(path)
    try:
        exists = path.exists()
    except PermissionError:
        exists = True  # a folder above it cannot be entered
    for folder in reversed([path, *path.parents]):
        try:
            folder.stat()
        except PermissionError:
            raise cannot_read(path, what or "the path") from None
        except OSError:
            return
    if exists and not os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
        raise cannot_read(path, what or ("the folder" if path.is_dir() else "the file"))


def read_text(path: str | Path, *, what: str = "text file") -> str:
    """Read a UTF-8 text file; a missing, empty, binary or non-UTF-8 file is a QkvError."""
    path = Path(path)
    if path.is_dir():
        raise QkvError(f"{what} {path} is a directory: give a file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise QkvError(f"{what} {path} does not exist: check the path") from None
    except PermissionError:
        raise cannot_read(path, what) from None
    except OSError as error:
        raise QkvError(f"cannot read {what} {path} ({error.strerror}): check its permissions") from None
    if not data.strip():
        raise QkvError(f"{what} {path} is empty: give a file with text in it")
    if b"\x00" in data[:8192]:
        raise QkvError(f"{what} {path} looks binary (it contains NUL bytes): give a plain UTF-8 text file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise QkvError(
            f"{what} {path} is not valid UTF-8: byte 0x{data[error.start]:02x} at offset {error.start} "
            f"(line {line}); convert it, e.g. `iconv -f latin1 -t utf-8 {path.name}`"
        ) from None


def read_json(path: str | Path, *, what: str = "JSON file") -> Any:
    """Parse a JSON file; problems become a QkvError naming the file and the line."""
    text = read_text(path, what=what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise QkvError(
            f"{what} {path} is not valid JSON (line {error.lineno}: {error.msg}): restore or re-create it"
        ) from None
