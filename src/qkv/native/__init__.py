"""qkv's kernels in C: compiled on first use by the machine's C compiler, cached, loaded with ctypes.

PyTorch's operators cost a few microseconds each to dispatch; a decoding step of a small model calls
thousands of them, which can cost as much as the arithmetic (docs/generation.md, "A decode step in one
call"). The C sources beside this file (``decode_step.c``, ``products.h``) do a whole step in one call. They
are built the first time they are needed, with

    $CC (default cc) -O3 -march=native -ffp-contract=off -fopenmp -fPIC -shared decode_step.c -lm

into ``$QKV_CACHE/native`` (default ``~/.cache/qkv/native``), under a name that hashes the sources, the
flags, the compiler's version and the CPU's features, so a changed source or another machine builds anew
and every later process loads the cached library in milliseconds. Processes that need the same library at once
(a server's workers, parallel test workers) build it once: the others wait on a lock file beside it and load it.
The library links the OpenMP runtime by its soname, so loaded after torch it shares torch's threads instead of
bringing a second pool.

Where no compiler is found, the build fails, or ``QKV_NATIVE=0`` is set, :func:`library` returns None and
says why once (:func:`unavailable_reason`); callers then run their PyTorch path, which gives the same numbers
up to rounding. Nothing here imports the rest of qkv.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SOURCES = (
    "decode_step.c", "vectors.h", "products.h", "int8_rows.h", "int4_rows.h", "int4_lanes.h", "attention.h",
    "forward.h", "shares.h", "prompt_attention.h", "attention_backward.h", "swiglu.h", "rms_norm.h", "rotary.h",
    "cross_entropy.h", "logit_scan.h", "int8_lanes.h", "rows_avx2.h", "lanes_avx2.h", "inputs.h", "activations.h",
)  # fmt: skip
HERE = Path(__file__).parent  # where the sources are
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared")
LIBRARIES = ("-lm",)
BUILD_TIMEOUT = 300  # seconds: a first build takes a few on an idle machine

_loaded: dict[str, ctypes.CDLL | None] = {}
_reasons: dict[str, str] = {}
_lock = threading.Lock()


def cache_dir() -> Path:
    """Where built libraries are kept: $QKV_CACHE/native, else $XDG_CACHE_HOME/qkv/native, else ~/.cache/..."""
    root = os.environ.get("QKV_CACHE")
    if root:
        return Path(root) / "native"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "qkv" / "native"


def compiler() -> str | None:
    """The C compiler to build with ($CC, else cc, gcc or clang on the PATH), or None."""
    named = os.environ.get("CC")
    for candidate in [named] if named else ["cc", "gcc", "clang"]:
        found = shutil.which(candidate)
        if found:
            return found
    return None


def _cpu_features() -> str:
    """The CPU's feature flags (what -march=native compiles for), as well as this platform can tell."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _key(cc: str) -> str:
    """A hash of everything the built library depends on."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update((HERE / name).read_bytes())
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    for part in (*FLAGS, *LIBRARIES, version, _cpu_features(), platform.machine(), sys.platform):
        digest.update(part.encode())
    return digest.hexdigest()[:20]


def build(name: str = "decode_step") -> Path:
    """The path of the built library ``name`` (from ``name``.c), compiling it if it is not cached yet.
    Raises OSError (no compiler, or the build failed, with the compiler's message)."""
    cc = compiler()
    if cc is None:
        raise OSError("no C compiler found (set CC, or install gcc or clang)")
    folder = cache_dir()
    target = folder / f"{name}-{_key(cc)}.so"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with _only_builder(folder / f"{target.stem}.lock"):
        if target.is_file():  # another process built it while this one waited
            return target
        return _compile(cc, name, target)


@contextmanager
def _only_builder(lock: Path) -> Iterator[None]:
    """Holds ``lock`` (an exclusive flock) so that one process at a time builds a library; where flock is missing
    (Windows), concurrent builds each write the same bytes and the last rename wins."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _compile(cc: str, name: str, target: Path) -> Path:
    """``name``.c built into ``target`` (atomically); OSError with the compiler's first line if it fails."""
    folder = target.parent
    source = HERE / f"{name}.c"
    with tempfile.TemporaryDirectory(dir=folder) as scratch:  # the same file system: an atomic rename
        built = Path(scratch) / target.name
        result = subprocess.run(
            [cc, *FLAGS, "-o", str(built), str(source), *LIBRARIES],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
        )
        if result.returncode != 0 or not built.is_file():
            message = (result.stderr or result.stdout).strip().splitlines()
            raise OSError(f"{Path(cc).name} failed on {source.name}: {message[0] if message else result.returncode}")
        os.replace(built, target)
    return target


def library(name: str = "decode_step") -> ctypes.CDLL | None:
    """The loaded library ``name``, built on first use; None when it cannot be had (see the module docstring)."""
    with _lock:
        if name in _loaded:
            return _loaded[name]
        lib = None
        if os.environ.get("QKV_NATIVE", "1") == "0":
            _reasons[name] = "QKV_NATIVE=0 turns the C kernels off"
        else:
            try:
                import torch  # noqa: F401  torch's OpenMP runtime first, so the library binds to it

                lib = ctypes.CDLL(str(build(name)))
            except (OSError, subprocess.SubprocessError) as error:
                _reasons[name] = str(error)
        _loaded[name] = lib
        return lib


def unavailable_reason(name: str = "decode_step") -> str | None:
    """Why :func:`library` gave None for ``name`` (None if it was loaded or not yet asked for)."""
    return _reasons.get(name)


def forget() -> None:
    """Drop what :func:`library` remembers (tests change the environment between calls)."""
    with _lock:
        _loaded.clear()
        _reasons.clear()
