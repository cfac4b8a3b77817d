"""Atomic writes (qkv.io): a write killed before its rename leaves a temporary file that the next write of the
same target deletes, while the temporary file of a write still running stays and that write completes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qkv.io import atomic_write, atomic_write_text, remove_killed_writes

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="advisory locks (fcntl) are POSIX")

# A writer in its own process: it writes half of its bytes, says so by creating READY, and waits for GO.
WRITER = """
import sys, time
from pathlib import Path
from qkv.io import atomic_write
target, ready, go = map(Path, sys.argv[1:])
def write(tmp):
    Path(tmp).write_text("half")
    ready.touch()
    while not go.exists():
        time.sleep(0.01)
    Path(tmp).write_text("whole")
atomic_write(target, write)
"""


def start_writer(tmp_path: Path, target: Path) -> tuple[subprocess.Popen, Path]:
    ready, go = tmp_path / "ready", tmp_path / "go"
    process = subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(ready), str(go)])
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert process.poll() is None and time.monotonic() < deadline, "the writer did not start"
        time.sleep(0.01)
    return process, go


def temporaries(target: Path) -> list[Path]:
    return sorted(target.parent.glob(f".{target.name}.*.tmp"))


def test_the_next_write_deletes_what_a_killed_write_left(tmp_path) -> None:
    target = tmp_path / "m.gguf"
    process, _ = start_writer(tmp_path, target)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    (left,) = temporaries(target)
    assert left.read_text() == "half" and not target.exists()
    unrelated = [tmp_path / ".other.gguf.abc.tmp", tmp_path / ".m.gguf.tmp", tmp_path / "m.gguf.x.tmp"]
    for path in unrelated:
        path.write_text("not m.gguf's")
    atomic_write_text(target, "new")
    assert target.read_text() == "new" and temporaries(target) == []
    assert all(path.exists() for path in unrelated)  # another target's, or not a temporary file's name


def test_a_running_write_keeps_its_temporary_file_and_completes(tmp_path) -> None:
    target = tmp_path / "config.json"
    process, go = start_writer(tmp_path, target)
    try:
        (running,) = temporaries(target)
        assert remove_killed_writes(target) == []
        atomic_write_text(target, "mine")  # a second write of the same target meanwhile
        assert running.exists() and target.read_text() == "mine"
    finally:
        go.touch()
        assert process.wait(timeout=60) == 0
    assert target.read_text() == "whole" and temporaries(target) == []  # the later rename wins


def test_a_failed_write_leaves_nothing(tmp_path) -> None:
    target = tmp_path / "weights.bin"

    def fail(tmp: str) -> None:
        Path(tmp).write_bytes(b"half")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        atomic_write(target, fail)
    assert not target.exists() and temporaries(target) == []
