"""One parse of each GGUF file per test process for the reference libraries.

transformers' GGUF loader reads a file's header and metadata with gguf-py's ``GGUFReader`` twice per model (config,
then weights) and once more per tokenizer, about 10 s each for SmolLM2's 49,152-token vocabulary on a busy core, and
builds gguf-py's tensor-name map once per module it walks (~400 times, ~15 s in all): a model and its tokenizer took
~45 s of a test's setup. Both are pure functions of their arguments (the reader of an unchanged file, opened
read-only; the map of an architecture and block count), so each result is kept and handed out again. The numbers
the references compute do not change; only their repeated parsing is skipped.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any


def _file_key(path: Any) -> tuple | None:
    """What identifies one version of a file: its resolved path, inode, size and modification time; None for what is
    not a path to a file (an open file object), which is never shared."""
    if not isinstance(path, str | os.PathLike):
        return None
    try:
        real = Path(path).resolve()
        stat = real.stat()
    except OSError:
        return None
    return str(real), stat.st_ino, stat.st_size, stat.st_mtime_ns


def share_gguf_parses() -> None:
    """Make ``gguf.GGUFReader`` (read-only) and ``gguf.get_tensor_name_map`` keep their results; nothing where gguf
    is not installed. transformers imports both from ``gguf`` inside its functions, so it finds these."""
    try:
        import gguf
    except ImportError:
        return
    if getattr(gguf, "_qkv_tests_share_parses", False):
        return
    reader_class = gguf.GGUFReader
    readers: dict[tuple, Any] = {}

    def reader(path: Any, mode: str = "r") -> Any:
        key = _file_key(path) if mode == "r" else None
        if key is None:
            return reader_class(path, mode)
        if key not in readers:
            if len(readers) >= 4:  # a few files at once: tests write small ones by the hundred
                readers.pop(next(iter(readers)))
            readers[key] = reader_class(path, mode)
        return readers[key]

    gguf.GGUFReader = reader
    gguf.get_tensor_name_map = functools.cache(gguf.get_tensor_name_map)
    gguf._qkv_tests_share_parses = True
