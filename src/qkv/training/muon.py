"""Muon: momentum SGD whose update for each weight matrix is orthogonalised (Jordan et al., 2024).

For a matrix parameter W with gradient G, Muon keeps a momentum buffer M = mu M + G, and instead of
stepping along M it steps along the closest semi-orthogonal matrix to M (U V^T from its SVD M = U S V^T),
computed approximately with a few Newton-Schulz iterations. Every direction of the update then gets the
same size, which lets rarely-updated directions learn as fast as dominant ones; on small transformers it
reaches a given loss in noticeably fewer steps than AdamW. Muon is for the 2-D matrices inside the blocks
(W_q, W_k, W_v, W_o, the FFN); embeddings, the unembedding, biases and LayerNorm gains stay with AdamW.

The iteration only needs to push singular values into a band around 1, so on a GPU it runs in bfloat16
(fast tensor-core matmuls); on a CPU, where bfloat16 matmuls are slow, it stays in float32. With several
processes the Newton-Schulz work is shared (the scheme of Muon's reference implementation): every process
has the same gradients (after DDP's all-reduce, or after gathering FSDP's shards per matrix), each one
orthogonalises its share of the matrices, and the results are all-gathered, so every process applies the
same update to its copy (or, under FSDP, to its shard).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from qkv.sharded import placed_like, whole


def orthogonalize(matrix: Tensor, steps: int = 5, *, dtype: torch.dtype | None = None) -> Tensor:
    """An approximation of U V^T for matrix = U S V^T by a quintic Newton-Schulz iteration.

    ``matrix`` may be a stack (..., rows, cols) of same-shaped matrices, orthogonalised together. The
    iterations run in ``dtype`` (default: the matrix's own); the result has the matrix's dtype.
    """
    a, b, c = 3.4445, -4.7750, 2.0315  # coefficients that push every singular value towards 1 quickly
    x = matrix / (matrix.norm(dim=(-2, -1), keepdim=True) + 1e-7)  # singular values now <= 1
    x = x.to(dtype or matrix.dtype)
    transposed = x.shape[-2] > x.shape[-1]
    if transposed:  # work with the smaller Gram matrix
        x = x.mT
    shape = x.shape
    x = x.reshape(-1, *shape[-2:])  # (stack, rows, cols): baddbmm fuses the scalings into the products
    for _ in range(steps):
        gram = x @ x.mT
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b G + c G^2
        x = torch.baddbmm(x, poly, x, beta=a)  # a X + (b G + c G^2) X
    x = x.reshape(shape).to(matrix.dtype)
    return x.mT if transposed else x


def newton_schulz_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on CUDA (tensor cores), float32 elsewhere (bfloat16 matmuls are slow on most CPUs)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def orthogonalize_shared(stack: Tensor, steps: int = 5, *, dtype: torch.dtype | None = None) -> Tensor:
    """:func:`orthogonalize` of a stack (n, rows, cols) that every process holds, the work split between them.

    The stack is padded to a multiple of the number of processes W with zero matrices (which stay zero);
    process r orthogonalises matrices r*k .. (r+1)*k - 1 (k = padded n / W), and an all-gather puts every
    result on every process. Without a process group this is :func:`orthogonalize`.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return orthogonalize(stack, steps, dtype=dtype)
    world, rank = dist.get_world_size(), dist.get_rank()
    n = stack.shape[0]
    per_rank = -(-n // world)
    padded = torch.cat([stack, stack.new_zeros(per_rank * world - n, *stack.shape[1:])]) if n % world else stack
    mine = orthogonalize(padded[rank * per_rank : (rank + 1) * per_rank], steps, dtype=dtype).contiguous()
    pieces = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(pieces, mine)
    return torch.cat(pieces)[:n]


def muon_update(optimizer: torch.optim.Optimizer, group: dict, *, share: bool = False) -> None:
    """One Muon step for the parameters of ``group`` (momentum buffers live in ``optimizer.state``).

    Matrices of the same shape are orthogonalised as one stack (one batched matmul per iteration instead
    of one per matrix). ``share``: split that work between the processes of the default process group
    (:func:`orthogonalize_shared`); every process must hold the same gradients. Parameters sharded by FSDP
    (DTensors) are gathered per matrix before the iteration and each process keeps its rows of the update.
    """
    by_shape: dict[tuple[int, ...], list[Tensor]] = {}
    for p in group["params"]:
        if p.grad is not None:
            by_shape.setdefault(tuple(p.shape), []).append(p)  # a DTensor's shape is the whole matrix's
    momentum, lr = group["momentum"], group["lr"]
    for shape, params in by_shape.items():
        buffers = []
        for p in params:
            state = optimizer.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buffers.append(state["momentum_buffer"])
        grads = [p.grad for p in params if p.grad is not None]  # all of them: by_shape holds those with a grad
        # Multi-tensor ("foreach") kernels: a few launches for the whole stack instead of three per matrix.
        torch._foreach_mul_(buffers, momentum)
        torch._foreach_add_(buffers, grads)  # M = mu M + G
        directions = torch._foreach_add(grads, buffers, alpha=momentum)  # Nesterov: G + mu M
        stack = torch.stack([whole(d) for d in directions])  # (n, rows, cols): FSDP's shards gathered per matrix
        dtype = newton_schulz_dtype(stack.device)
        updates = list((orthogonalize_shared if share else orthogonalize)(stack, group.get("ns_steps", 5), dtype=dtype))
        updates = [placed_like(u, p) for u, p in zip(updates, params, strict=True)]  # FSDP: this process's rows
        if group["weight_decay"]:
            torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
        scale = max(1.0, shape[0] / shape[1]) ** 0.5  # tall matrices: keep the update's RMS
        torch._foreach_add_(params, updates, alpha=-lr * scale)


class Muon(torch.optim.Optimizer):
    """Orthogonalised Nesterov momentum for 2-D parameters; decoupled weight decay as in AdamW."""

    def __init__(
        self,
        params,
        lr: float = 0.02,
        momentum: float = 0.95,
        weight_decay: float = 0.0,
        ns_steps: int = 5,
        *,
        share: bool = False,
    ) -> None:
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, ns_steps=ns_steps))
        self.share = share  # not in param_groups: a checkpoint must not carry it to a run with one process

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001
        for group in self.param_groups:
            muon_update(self, group, share=self.share)
        return None
