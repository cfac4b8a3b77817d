"""How the model runs while it trains: compiled or not, and how several processes share it (DDP or FSDP).

Under ``torchrun`` N processes train one model, each on its own rows of every global batch.

- **DDP** (``--strategy ddp``, the default): every process holds the whole model and optimizer state;
  during the backward pass the gradients are averaged over the processes (all-reduce, overlapped with the
  backward), so every copy takes the same step. Memory per process: the whole model, its gradients and
  the optimizer state (16 bytes per parameter with AdamW in float32).
- **FSDP** (``--strategy fsdp``, torch's FSDP2 ``fully_shard``): every process holds 1/N of each
  parameter, gradient and optimizer state (DTensors split along their first dimension). Each block is one
  unit: just before it runs (forward, and again backward) its whole weights are all-gathered, and freed
  after; gradients are reduce-scattered, so every process gets the mean gradient of its shard. The root
  unit holds the rest (embeddings, the unembedding, the final norm). Memory per process: 16/N bytes per
  parameter plus one block's whole weights at a time; for models that do not fit one device.

Either way the arithmetic is that of one process with the global batch; only the order of floating-point
sums differs. Checkpoints do not depend on the strategy: :func:`full_model_state` and
:func:`full_optimizer_state` gather every shard into whole tensors in the layout a single process has,
and loading gives every process its rows of them (:func:`shard_optimizer_state`, and ``load_weights``
for the model), so a run can resume under another strategy or number of processes.

``torch.compile`` compiles the model's forward (and, through AOTAutograd, its backward) into fused kernels;
the trainer's Python stays eager. It is applied around DDP (so DDP's optimizer splits the graph at its
gradient buckets and communication still overlaps the backward) and after FSDP's sharding.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn

from qkv.sharded import is_sharded, placed_like, whole
from qkv.training.distributed import DistInfo

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule


def use_compile(setting: str, device: torch.device) -> bool:
    """``on``, ``off``, or ``auto``: on for CUDA only (on a CPU it made training slower: docs/training.md)."""
    return setting == "on" or (setting == "auto" and device.type == "cuda")


def block_modules(model: nn.Module) -> list[nn.Module]:
    """The blocks of each stack the model's family names (its ``streams``: encoder, then decoder), in order:
    FSDP's units. A family without block stacks (RNNSearch's GRUs, Word2Vec) has none."""
    from qkv.models.family import family_of

    return family_of(model).blocks(model)


def shard_model(model: nn.Module, device: torch.device, world_size: int) -> None:
    """FSDP2 in place: ``fully_shard`` every block, then the root (embeddings, unembedding, norms)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world_size,))
    for block in block_modules(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


class TrainingModel:
    """The module a training step calls (compiled, DDP-wrapped), and the plain one everything else uses.

    ``plain`` is the model itself (sharded in place under FSDP): evaluation, decoding, capture and saving
    use it, so they run in eager mode and never see torch.compile's ``_orig_mod.`` or DDP's ``module.``.
    """

    def __init__(
        self, model: nn.Module, *, strategy: str, dist_info: DistInfo, device: torch.device, compile: bool
    ) -> None:
        self.plain = model
        self.strategy = strategy if dist_info.enabled else "single"
        self.ddp: nn.parallel.DistributedDataParallel | None = None
        step_model: nn.Module = model
        if self.strategy == "fsdp":
            shard_model(model, device, dist_info.world_size)
        elif self.strategy == "ddp":
            device_ids = [device.index] if device.type == "cuda" else None
            self.ddp = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
            step_model = self.ddp
        self.compiled = compile
        # torch.compile of a module returns an OptimizedModule (a module); its stubs say a plain callable.
        self.step_model = cast(nn.Module, torch.compile(step_model)) if compile else step_model

    def gradient_sync(self, enabled: bool):
        """A context in which backward does (or, for all but the last micro-batch, does not) sync gradients."""
        if self.ddp is not None and not enabled:
            return self.ddp.no_sync()
        if self.strategy == "fsdp":
            cast("FSDPModule", self.plain).set_requires_gradient_sync(enabled)  # fully_shard made it one
        return contextlib.nullcontext()


def has_shards(model: nn.Module) -> bool:
    """True for a model sharded by FSDP (its parameters are DTensors)."""
    return any(is_sharded(p) for p in model.parameters())


def _whole(tensor: Tensor, keep: bool) -> Tensor | None:
    """A DTensor gathered whole (collective: every process must call this), on the CPU where kept."""
    full = whole(tensor)  # every process takes part in the gathering, rank 0 keeps the result
    return full.detach().cpu() if keep else None


def _is_main() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


@torch.no_grad()
def full_model_state(model: nn.Module) -> dict[str, Tensor] | None:
    """Every weight of a sharded model whole, by state-dict name, on the CPU of rank 0 (None elsewhere).

    Collective: every process must call it. Tied names share one tensor, as in an unsharded state dict.
    Returns None for a model that is not sharded (its own ``state_dict()`` is already whole). Tensors are
    gathered one at a time, so a process never holds more than one whole tensor on its device.
    """
    if not has_shards(model):
        return None
    keep = _is_main()
    gathered: dict[int, Tensor | None] = {}
    state: dict[str, Tensor] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():  # keep_vars: tied names, one object
        if id(tensor) not in gathered:
            gathered[id(tensor)] = _whole(tensor, keep)
        if keep:
            kept = gathered[id(tensor)]
            assert kept is not None  # _whole keeps every tensor on the main process
            state[name] = kept
    return state if keep else None


def _map_tensors(value: Any, function) -> Any:  # noqa: ANN001
    if isinstance(value, Tensor):
        return function(value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, function) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, function) for v in value)
    return value


@torch.no_grad()
def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
    """``optimizer.state_dict()`` with every sharded tensor gathered whole, on rank 0 (None elsewhere).

    Collective, like :func:`full_model_state`; None when no parameter is sharded. The result has the layout
    of an unsharded optimizer's state dict (states keyed by parameter index), so a checkpoint is the same
    whatever the strategy.
    """
    sharded = any(is_sharded(p) for group in optimizer.param_groups for p in group["params"])
    if not sharded:
        return None
    keep = _is_main()
    state = _map_tensors(optimizer.state_dict(), lambda t: _whole(t, keep))
    return state if keep else None


@torch.no_grad()
def shard_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """After loading a whole-tensor state dict into an optimizer over sharded parameters: keep each process's
    rows of every per-parameter state (AdamW's moments, Muon's momentum) as a DTensor placed like its
    parameter. Scalars (AdamW's step) stay as they are; nothing is communicated."""
    for parameter, state in optimizer.state.items():
        if not is_sharded(parameter):
            continue
        for key, value in state.items():
            if isinstance(value, Tensor) and not is_sharded(value) and value.shape == parameter.shape:
                state[key] = placed_like(value, parameter)
