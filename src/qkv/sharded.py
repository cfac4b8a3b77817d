"""Tensors split across processes: the DTensors that FSDP makes of a model's parameters.

Under FSDP (``qkv train --strategy fsdp``) each process holds a shard of every parameter, a
``torch.distributed.tensor.DTensor``: ``.shape`` is the whole tensor's, ``.to_local()`` this process's
rows, ``.full_tensor()`` the whole tensor gathered from every process (a collective call). Code that saves,
loads or updates weights asks :func:`is_sharded` and treats a shard accordingly.

Importing ``torch.distributed.tensor`` takes about a second, and only a sharded model has DTensors, so
nothing here imports it: if it has not been imported, no tensor can be a DTensor.
"""

from __future__ import annotations

import sys

from torch import Tensor


def is_sharded(tensor: object) -> bool:
    """True for a DTensor (a shard of a tensor split across processes)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def local_part(tensor: Tensor) -> Tensor:
    """This process's rows of a DTensor, or the tensor itself."""
    return tensor.to_local() if is_sharded(tensor) else tensor  # type: ignore[attr-defined]


def whole(tensor: Tensor) -> Tensor:
    """A DTensor gathered from every process (collective: every process must call it), or the tensor itself."""
    return tensor.full_tensor() if is_sharded(tensor) else tensor  # type: ignore[attr-defined]


def placed_like(full: Tensor, like: Tensor) -> Tensor:
    """``full`` (the whole tensor, the same on every process) as ``like`` holds it: for a DTensor, this
    process's rows of it with ``like``'s placement (taken locally, nothing is communicated)."""
    if not is_sharded(like):
        return full
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full.to(like.device), like.device_mesh, like.placements, src_data_rank=None)  # type: ignore[attr-defined]
