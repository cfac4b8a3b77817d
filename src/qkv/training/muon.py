"""Muon: momentum SGD whose update for each weight matrix is orthogonalised (Jordan et al., 2024).

For a matrix parameter W with gradient G, Muon keeps a momentum buffer M = mu M + G, and instead of
stepping along M it steps along the closest semi-orthogonal matrix to M (U V^T from its SVD M = U S V^T),
computed approximately with a few Newton-Schulz iterations. Every direction of the update then gets the
same size, which lets rarely-updated directions learn as fast as dominant ones; on small transformers it
reaches a given loss in noticeably fewer steps than AdamW. Muon is for the 2-D matrices inside the blocks
(W_q, W_k, W_v, W_o, the FFN); embeddings, the unembedding, biases and LayerNorm gains stay with AdamW.
"""

from __future__ import annotations

import torch
from torch import Tensor


def orthogonalize(matrix: Tensor, steps: int = 5) -> Tensor:
    """An approximation of U V^T for matrix = U S V^T by a quintic Newton-Schulz iteration.

    ``matrix`` may be a stack (..., rows, cols) of same-shaped matrices, orthogonalised together.
    """
    a, b, c = 3.4445, -4.7750, 2.0315  # coefficients that push every singular value towards 1 quickly
    x = matrix / (matrix.norm(dim=(-2, -1), keepdim=True) + 1e-7)  # singular values now <= 1
    transposed = x.shape[-2] > x.shape[-1]
    if transposed:  # work with the smaller Gram matrix
        x = x.mT
    shape = x.shape
    x = x.reshape(-1, *shape[-2:])  # (stack, rows, cols): baddbmm fuses the scalings into the products
    for _ in range(steps):
        gram = x @ x.mT
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b G + c G^2
        x = torch.baddbmm(x, poly, x, beta=a)  # a X + (b G + c G^2) X
    x = x.reshape(shape)
    return x.mT if transposed else x


def muon_update(optimizer: torch.optim.Optimizer, group: dict) -> None:
    """One Muon step for the parameters of ``group`` (momentum buffers live in ``optimizer.state``).

    Matrices of the same shape are orthogonalised as one stack (one batched matmul per iteration instead
    of one per matrix).
    """
    by_shape: dict[tuple[int, ...], list[Tensor]] = {}
    for p in group["params"]:
        if p.grad is not None:
            by_shape.setdefault(tuple(p.shape), []).append(p)
    momentum = group["momentum"]
    for shape, params in by_shape.items():
        directions = []
        for p in params:
            state = optimizer.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buffer = state["momentum_buffer"]
            buffer.mul_(momentum).add_(p.grad)
            directions.append(p.grad.add(buffer, alpha=momentum))  # Nesterov momentum
        updates = orthogonalize(torch.stack(directions), group.get("ns_steps", 5))
        scale = max(1.0, shape[0] / shape[1]) ** 0.5  # tall matrices: keep the update's RMS
        for p, update in zip(params, updates, strict=True):
            if group["weight_decay"]:
                p.mul_(1 - group["lr"] * group["weight_decay"])
            p.add_(update, alpha=-group["lr"] * scale)


class Muon(torch.optim.Optimizer):
    """Orthogonalised Nesterov momentum for 2-D parameters; decoupled weight decay as in AdamW."""

    def __init__(
        self, params, lr: float = 0.02, momentum: float = 0.95, weight_decay: float = 0.0, ns_steps: int = 5
    ) -> None:
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, ns_steps=ns_steps))

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001
        for group in self.param_groups:
            muon_update(self, group)
        return None
