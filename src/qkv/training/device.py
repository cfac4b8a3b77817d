"""Where to train and in which precision.

``auto`` picks CUDA, then Apple's MPS, then the CPU. On CUDA, ``auto`` precision trains in bfloat16
autocast when the GPU supports it, else float16 autocast with a gradient scaler (small fp16 gradients
would underflow to zero without it). On the CPU it stays in float32: bf16 matmuls are slow on CPUs
without bfloat16 instructions (AVX512_BF16 or AMX); where they exist, ``--precision bf16`` asks for them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass

import torch

from qkv.devices import resolve_device  # noqa: F401  (re-exported: the trainer's and the verbs' import)
from qkv.errors import QkvError


def set_threads(threads: int | None) -> None:
    """Let torch use ``threads`` CPU threads. None: one per core that other processes leave idle right now
    (:func:`default_threads`), with a note on stderr when that is fewer than the cores; OMP_NUM_THREADS, if
    set, is left to decide."""
    if threads is None:
        if os.environ.get("OMP_NUM_THREADS"):
            return
        cores, busy = usable_cores(), busy_cores()
        chosen = default_threads(cores, busy)
        if chosen < torch.get_num_threads():
            torch.set_num_threads(chosen)
            print(
                f"note: other processes keep {busy:.1f} of the {cores} cores busy: using {chosen} thread"
                f"{'s' if chosen > 1 else ''} (threads that wait for a busy core slow every step); "
                f"--threads {cores} uses them all",
                file=sys.stderr,
            )
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise QkvError(f"--threads must be a positive whole number, got {threads!r}: e.g. --threads 2")
    torch.set_num_threads(threads)


def default_threads(cores: int, busy: float | None) -> int:
    """Threads for a machine with ``cores`` usable cores of which ``busy`` are in use by other processes.

    One per idle core, at least one. Torch's threads meet at a barrier after every parallel op, and a thread
    that shares its core with another process makes the others spin there until the scheduler gives it a
    turn (docs/training.md, "CPU threads on a busy machine", has the measurements). ``busy`` None (unknown)
    means all cores.
    """
    if busy is None:
        return max(1, cores)
    return max(1, min(cores, int(cores - busy + 0.5)))


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. under taskset or a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def busy_cores(seconds: float = 0.1) -> float | None:
    """How many cores are busy now, measured from /proc/stat over ``seconds`` while this process sleeps
    (Linux); elsewhere the 1-minute load average; None when neither can be read."""
    try:
        before = _cpu_times()
        time.sleep(seconds)
        after = _cpu_times()
    except (OSError, ValueError, IndexError):
        try:
            return os.getloadavg()[0]
        except (OSError, AttributeError):
            return None
    total, idle = after[0] - before[0], after[1] - before[1]
    return None if total <= 0 else (1 - idle / total) * (os.cpu_count() or 1)


def _cpu_times() -> tuple[int, int]:
    """(all, idle) jiffies of every CPU since boot: the first line of /proc/stat."""
    with open("/proc/stat", encoding="ascii") as stat:
        values = [int(v) for v in stat.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(values), values[3] + values[4]


@dataclass
class Precision:
    """The autocast dtype (None: full float32) and whether a gradient scaler is needed."""

    dtype: torch.dtype | None
    device_type: str

    @property
    def needs_scaler(self) -> bool:
        return self.dtype == torch.float16

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def scaler(self) -> torch.amp.GradScaler | None:
        return torch.amp.GradScaler(self.device_type) if self.needs_scaler else None


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``. A CPU tensor bound for a GPU is copied from pinned (page-locked) memory
    without blocking: a copy from ordinary memory would first wait for all the work queued on the GPU,
    leaving it idle while the host prepares the next step."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def resolve_precision(name: str, device: torch.device) -> Precision:
    """``auto``: bf16 on CUDA GPUs that support it, fp16 on other GPUs, fp32 on CPU/MPS."""
    if name == "auto":
        if device.type == "cuda":
            name = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        else:
            name = "fp32"
    if name == "fp16" and device.type == "cpu":
        raise QkvError("--precision fp16 is for GPUs: use fp32 (or bf16) on the CPU")
    dtypes = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
    return Precision(dtypes[name], device.type)
