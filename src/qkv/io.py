"""Reading and writing files safely.

Writes are atomic: the bytes go to a temporary file in the same directory, which is then renamed over the
target, so an interrupted write never leaves a half-written checkpoint or config. Reads turn the usual
failures (missing file, empty file, invalid UTF-8, invalid JSON) into one :class:`QkvError` sentence that
names the file and the fix.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qkv.errors import QkvError


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call ``write(temp_path)`` and then rename the temporary file to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as written:  # the bytes reach the disk before the rename makes them visible
            os.fsync(written.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes files private; checkpoints are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def read_text(path: str | Path, *, what: str = "text file") -> str:
    """Read a UTF-8 text file; a missing, empty, binary or non-UTF-8 file is a QkvError."""
    path = Path(path)
    if path.is_dir():
        raise QkvError(f"{what} {path} is a directory: give a file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise QkvError(f"{what} {path} does not exist: check the path") from None
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
