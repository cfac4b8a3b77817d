"""The optimizer: Muon for the blocks' weight matrices, AdamW for everything else (or AdamW throughout; or
plain SGD, which Word2Vec trains with).

Weight decay pulls weights towards zero; it is meant for matrices that mix features, not for biases and
LayerNorm gains, whose scale carries meaning. AdamW is used as torch's fused kernel where torch has one
(one pass over all parameters instead of several small ops per tensor).

Muon (:mod:`qkv.training.muon`) orthogonalises the momentum of each matrix of the linear layers inside the
blocks (W_q, W_k, W_v, W_o, W_1, W_2): a lower validation loss for a slower step, measured on Tiny
Shakespeare in docs/training.md. Embeddings, the unembedding, biases and LayerNorm gains keep AdamW, as Muon's authors
recommend.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.optim.adamw import adamw

from qkv.training.muon import muon_update

OPTIMIZERS = ("muon", "adamw", "sgd")


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: tensors with >= 2 dimensions decay, the rest do not. Tied tensors appear once."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for parameter in model.parameters():  # parameters() yields a tied tensor once
        if parameter.requires_grad:
            (decay if parameter.dim() >= 2 else no_decay).append(parameter)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def linear_weights(model: nn.Module) -> list[Tensor]:
    """The weight matrices of every nn.Linear (the blocks' projections; embeddings are not nn.Linear)."""
    seen: dict[int, Tensor] = {}
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.weight.requires_grad:
            seen.setdefault(id(module.weight), module.weight)
    return list(seen.values())


class MuonWithAdamW(torch.optim.Optimizer):
    """One optimizer object: Muon for the groups marked ``muon``, AdamW for the others.

    Being a single ``torch.optim.Optimizer`` keeps the trainer, learning-rate schedule and checkpoints the
    same as for plain AdamW. Each group's ``lr_scale`` multiplies the scheduled learning rate (Muon's own
    rate is larger than AdamW's).
    """

    def __init__(
        self, groups: list[dict], *, betas: tuple[float, float], eps: float = 1e-8, share: bool = False
    ) -> None:
        defaults = dict(lr=1e-3, betas=betas, eps=eps, weight_decay=0.0, muon=False, lr_scale=1.0, momentum=0.95)
        super().__init__(groups, defaults)
        self.share = share  # split Newton-Schulz between processes; not in param_groups, so not in checkpoints

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001
        for group in self.param_groups:
            if group["muon"]:
                muon_update(self, group, share=self.share)
            else:
                self._adamw_group(group)
        return None

    def _adamw_group(self, group: dict) -> None:
        """torch's own AdamW update (fused into one kernel on CPU and CUDA) for this group's tensors."""
        params = [p for p in group["params"] if p.grad is not None]
        for p in params:
            if not self.state[p]:
                self.state[p].update(
                    step=torch.zeros((), dtype=torch.float32, device=p.device),
                    exp_avg=torch.zeros_like(p),
                    exp_avg_sq=torch.zeros_like(p),
                )
        if not params:
            return
        states = [self.state[p] for p in params]
        beta1, beta2 = group["betas"]
        adamw(
            params,
            [p.grad for p in params],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            [s["step"] for s in states],
            fused=params[0].device.type in ("cpu", "cuda"),
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
        )


def make_optimizer(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    device_type: str,
    kind: str = "adamw",
    muon_lr: float = 0.02,
    muon_momentum: float = 0.95,
    muon_ns_steps: int = 5,
    distributed: bool = False,
) -> torch.optim.Optimizer:
    """AdamW over :func:`parameter_groups` (fused on CPU and CUDA), Muon + AdamW (``kind="muon"``), or plain
    SGD, w <- w - lr * grad, which also takes sparse gradients (Word2Vec's embedding rows).

    ``distributed``: the processes of the default process group share Muon's Newton-Schulz work (every
    process must call ``step`` with the same gradients, as under DDP or FSDP).
    """
    if kind == "sgd":
        return torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    if kind == "adamw":
        fused = device_type in ("cpu", "cuda")
        return torch.optim.AdamW(parameter_groups(model, weight_decay), lr=lr, betas=betas, fused=fused)
    matrices = linear_weights(model)
    chosen = {id(p) for p in matrices}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in chosen]
    groups = [
        {
            "params": matrices,
            "muon": True,
            "lr_scale": muon_lr / lr,
            "momentum": muon_momentum,
            "ns_steps": muon_ns_steps,
            "weight_decay": weight_decay,
        },
        {"params": [p for p in rest if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
    ]
    return MuonWithAdamW([g for g in groups if g["params"]], betas=betas, share=distributed)
