"""Where to train and in which precision.

``auto`` picks CUDA, then Apple's MPS, then the CPU. On CUDA, ``auto`` precision trains in bfloat16
autocast when the GPU supports it, else float16 autocast with a gradient scaler (small fp16 gradients
would underflow to zero without it). On the CPU it stays in float32: bf16 matmuls are slow on CPUs
without AMX.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from qkv.errors import QkvError


def set_threads(threads: int | None) -> None:
    """Let torch use ``threads`` CPU threads (None: leave its default, all cores)."""
    if threads is None:
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise QkvError(f"--threads must be a positive whole number, got {threads!r}: e.g. --threads 2")
    torch.set_num_threads(threads)


def resolve_device(name: str = "auto", *, local_rank: int = 0) -> torch.device:
    """A torch.device for ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``; QkvError if it is absent."""
    if not isinstance(name, str):
        raise QkvError(f"--device must be a name such as auto, cpu or cuda, got {name!r}")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank)
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise QkvError("--device cuda was asked for but no CUDA GPU is available: use --device cpu or auto")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise QkvError("--device mps was asked for but MPS is not available: use --device cpu or auto")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise QkvError(f"--device {name!r} is not a device: use auto, cpu, cuda or mps") from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise QkvError(f"--device {name!r} is not a device qkv runs on: use auto, cpu, cuda or mps")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise QkvError(f"--device {name} names a GPU that is absent ({torch.cuda.device_count()} found): use cuda:0")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)
    return device


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
