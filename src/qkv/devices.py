"""Naming the device a model runs on: ``auto`` (a CUDA GPU, then Apple's MPS, then the CPU), ``cpu``, ``cuda``,
``cuda:N`` or ``mps``. A name that is not a device, or a device this machine lacks, is one line (a
:class:`~qkv.errors.QkvError`) wherever it is given: a verb's ``--device``, ``qkv.load(device=...)``,
``qkv.views(device=...)``."""

from __future__ import annotations

import torch

from qkv.errors import QkvError


def resolve_device(name: str | torch.device = "auto", *, local_rank: int = 0, flag: str = "--device") -> torch.device:
    """A torch.device for ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``; QkvError if it is absent. ``flag`` is
    how the messages name the setting (``--device`` on the command line, ``device=`` from Python)."""
    if isinstance(name, torch.device):
        name = str(name)
    other = "use --device cpu or auto" if flag == "--device" else f"use {flag}='cpu' or 'auto'"
    if not isinstance(name, str):
        raise QkvError(f"{flag} must be a name such as auto, cpu or cuda, got {name!r}")
    if name == "auto":
        if torch.cuda.is_available():
            return _local_gpu(local_rank, flag)
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise QkvError(f"{flag} cuda was asked for but no CUDA GPU is available: {other}")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise QkvError(f"{flag} mps was asked for but MPS is not available: {other}")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise QkvError(f"{flag} {name!r} is not a device: use auto, cpu, cuda or mps") from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise QkvError(f"{flag} {name!r} is not a device qkv runs on: use auto, cpu, cuda or mps")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise QkvError(f"{flag} {name} names a GPU that is absent ({torch.cuda.device_count()} found): use cuda:0")
    if device.type == "cuda" and device.index is None:
        device = _local_gpu(local_rank, flag)
    return device


def _local_gpu(local_rank: int, flag: str) -> torch.device:
    """The GPU of the process with this local rank (one GPU per process, as torchrun starts them)."""
    count = torch.cuda.device_count()
    if local_rank >= count:
        cpu = "--device cpu" if flag == "--device" else f"{flag}'cpu'"
        raise QkvError(
            f"this machine has {count} CUDA GPU{'' if count == 1 else 's'} for {local_rank + 1} or more processes: "
            f"start at most {count} per machine (torchrun --nproc_per_node={count}), or train on the CPU with {cpu}"
        )
    return torch.device("cuda", local_rank)
