"""Several processes, one model: DistributedDataParallel under ``torchrun``.

``torchrun --nproc_per_node=N -m qkv train ...`` starts N copies of the same command with RANK,
WORLD_SIZE and LOCAL_RANK in the environment. Each process draws its own slice of the global batch; after
``backward`` DDP averages the gradients over processes, so every copy takes the same optimizer step, the
same as one process would with an N-times larger batch. Only rank 0 writes files and prints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device_type: str) -> DistInfo:
    """Join the process group if launched by torchrun (gloo on CPU, nccl on CUDA); else a single process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistInfo()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def shutdown_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def any_rank(flag: bool, info: DistInfo, device: torch.device) -> bool:
    """True if ``flag`` is True on any process (so all stop together, e.g. after Ctrl-C on one)."""
    if not info.enabled:
        return flag
    tensor = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def mean_over_ranks(value: float, info: DistInfo, device: torch.device) -> float:
    if not info.enabled:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.item() / info.world_size


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def broadcast_object(obj, info: DistInfo):
    """Rank 0's ``obj`` on every process (e.g. the run directory name rank 0 chose)."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
