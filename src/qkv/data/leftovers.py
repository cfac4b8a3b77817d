"""What a preparation (or an export) killed with SIGKILL would leave behind, and how nothing is left.

- Its hidden work folder ``.OUT.preparing-PID-XXXXXXXX`` beside ``OUT``: the process holds an exclusive
  lock on the folder's ``.owner`` file while it works, and the kernel drops that lock when the process dies,
  however it dies. The next preparation into the same parent folder removes every such folder whose lock it
  can take (its owner is gone) and says so; the folder of a preparation still running is locked and stays.
  ``qkv export`` writes its graphs in ``.NAME.onnx.exporting-PID-XXXXXXXX`` folders the same way.
- Its pool workers (the word tokenizer encodes in a process pool): on Linux each worker asks the kernel to
  kill it when its parent dies (``prctl(PR_SET_PDEATHSIG)``), so none is left orphaned holding memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import shutil
import signal
import sys
import uuid
from pathlib import Path
from typing import IO

try:
    import fcntl
except ImportError:  # Windows: no advisory locks here; stale folders are then left to the user
    fcntl = None  # type: ignore[assignment]  # the module is absent on Windows: None says so

OWNER_FILE = ".owner"
_PR_SET_PDEATHSIG = 1


def work_folder_prefix(out: Path, verb: str = "preparing") -> str:
    return f".{out.name}.{verb}-"


def make_work_folder(out: Path, verb: str = "preparing") -> tuple[Path, IO[str]]:
    """A new hidden folder beside ``out``, locked by this process; returns it and the open lock file (keep
    it open while working: closing it, or dying, releases the lock)."""
    work = out.parent / f"{work_folder_prefix(out, verb)}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    owner = open(work / OWNER_FILE, "w", encoding="ascii")  # noqa: SIM115 - held for the whole preparation
    if fcntl is not None:
        fcntl.flock(owner.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    owner.write(f"{os.getpid()}\n")
    owner.flush()
    return work, owner


def remove_stale_work_folders(out: Path, verb: str = "preparing") -> list[Path]:
    """Remove the work folders beside ``out`` whose process is gone, saying so on stderr; return them."""
    if fcntl is None or not out.parent.is_dir():
        return []
    removed = []
    for folder in sorted(out.parent.glob(glob.escape(work_folder_prefix(out, verb)) + "*")):
        if folder.is_dir() and _owner_is_gone(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
            what = "a preparation" if verb == "preparing" else "an export"
            print(f"removed {folder}, left by {what} that was killed", file=sys.stderr, flush=True)
    return removed


def _owner_is_gone(folder: Path) -> bool:
    """True when nobody holds the folder's lock. A folder without a lock file is just being made (its process
    is alive) or was left by a qkv that did not lock (no pid in its name)."""
    try:
        with open(folder / OWNER_FILE, encoding="ascii") as owner:
            fcntl.flock(owner.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(owner.fileno(), fcntl.LOCK_UN)
    except FileNotFoundError:
        pid = folder.name.rsplit("-", 2)[-2] if folder.name.count("-") >= 2 else ""
        return not pid.isdigit() or not _alive(int(pid))
    except OSError:  # locked by a live preparation, or not ours to open
        return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def die_with_parent(parent: int) -> None:
    """In a pool worker: be killed when the parent process dies (Linux; elsewhere nothing is done).

    ``parent`` is the parent's pid: if it died before the request was made, exit now."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)
