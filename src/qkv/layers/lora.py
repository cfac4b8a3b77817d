"""LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"): a frozen projection W plus a
trained update of rank r,

    y = W x + b + (alpha / r) B A dropout(x),      A: (r, d_in),  B: (d_out, r),  r << min(d_in, d_out).

Only A and B train, (d_in + d_out) r numbers instead of d_in d_out, so the optimizer's state and the gradients
shrink by the same factor, and W may stay in any form that can multiply: float, or int8 (QLoRA's idea, Dettmers
et al. 2023: the frozen base quantized, the adapters in float). As in PEFT, A starts Kaiming-uniform and B at
zero, so a fresh adapter changes nothing (the loss at step 0 is the base model's), and ``alpha / r`` scales the
update so that changing r does not change the learning rate that suits it.

:class:`LoRALinear` wraps the projection in place (``base``), keeping its interface (``in_features``,
``out_features``, ``bias``), and ``weight`` is the effective matrix W + (alpha / r) B A (computed on access), so
code that reads a layer's weights sees the numbers the layer multiplies by. Several projections may share one A
(GPT-2's fused ``c_attn`` is one LoRA over W_q, W_k and W_v: one A, and B's rows split between them).
:func:`merged` folds the update into a plain :class:`~qkv.layers.linear.Linear`. The decoding step stacks W_q,
W_k and W_v (:func:`qkv.layers.fused.fuse_linears`); for LoRA layers that is the bases stacked by their own
rule, then each update added to its columns (:class:`FusedLoRA`): the same numbers. In training over a frozen
float32 base, the forward and backward passes are one function that takes each product in its fastest order
(:mod:`qkv.layers.lora_product`).
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import Tensor, nn

from qkv.layers import lora_product
from qkv.layers.dropout import dropout_layer
from qkv.layers.fused import fuse_linears
from qkv.layers.linear import Linear


class LoRALinear(nn.Module):
    """``base(x) + scaling * B A dropout(x)`` with ``scaling = alpha / rank`` (see the module docstring).

    ``shared_a``: use this A (r, d_in) instead of a new one (projections that read the same input and form one
    adapter). ``base`` is frozen here (its parameters stop taking gradients).
    """

    def __init__(
        self, base: nn.Module, rank: int, alpha: float, *, dropout: float = 0.0, shared_a: nn.Parameter | None = None
    ) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"rank={rank} must be a positive whole number")
        self.base = base.requires_grad_(False)
        # the base is any linear layer (nn.Linear, Int8Linear, Int4Linear): module attributes read as Tensor | Module
        self.in_features: int = cast(int, base.in_features)
        self.out_features: int = cast(int, base.out_features)
        self.rank, self.alpha, self.scaling = rank, float(alpha), float(alpha) / rank
        like = next(base.parameters())
        dtype = like.dtype if like.is_floating_point() else torch.float32  # an int8 base: float adapters
        if shared_a is None:
            shared_a = nn.Parameter(torch.empty(rank, self.in_features, device=like.device, dtype=dtype))
            nn.init.kaiming_uniform_(shared_a, a=math.sqrt(5))  # PEFT's (and nn.Linear's) initialisation of A
        elif tuple(shared_a.shape) != (rank, self.in_features):
            raise ValueError(f"shared A has shape {tuple(shared_a.shape)}, expected {(rank, self.in_features)}")
        self.lora_A = shared_a  # (r, d_in)
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, device=like.device, dtype=dtype))  # (d_out, r)
        self.lora_dropout = dropout_layer(dropout)

    @property
    def bias(self) -> Tensor | None:
        return cast(Tensor | None, self.base.bias)

    @property
    def weight(self) -> Tensor:
        """The effective matrix W + scaling B A (d_out, d_in), a new tensor on every access."""
        return cast(Tensor, self.base.weight) + self.scaling * (self.lora_B @ self.lora_A)

    def add_update(self, out: Tensor, rows: Tensor) -> Tensor:
        """out + scaling B A dropout(rows), for rows (n, d_in) and the base's out (n, d_out): one product-and-add
        where their types agree; else (a base under bfloat16 autocast) the update in its own type, then cast."""
        low = self.lora_dropout(rows).to(self.lora_A.dtype) @ self.lora_A.T  # (n, r)
        if out.dtype == low.dtype == self.lora_B.dtype:
            return torch.addmm(out, low, self.lora_B.T, alpha=self.scaling)
        return out + ((low @ self.lora_B.T) * self.scaling).to(out.dtype)

    def forward(self, x: Tensor) -> Tensor:
        weight, bias = getattr(self.base, "weight", None), self.bias
        if (
            isinstance(self.lora_dropout, nn.Identity)
            and isinstance(self.base, nn.Linear)
            and not (self.base._forward_hooks or self.base._forward_pre_hooks)  # the base's forward is not called
            and isinstance(weight, Tensor)
            and lora_product.applies(x, weight, bias, self.lora_A, self.lora_B)
        ):  # a float32 base in training: one autograd function, each product in its fast order
            return lora_product.LoRAProduct.apply(x, weight, bias, self.lora_A, self.lora_B, self.scaling)
        rows = x.reshape(-1, self.in_features)  # (n, d_in)
        return self.add_update(self.base(rows), rows).view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha:g}"


def merged(layer: LoRALinear) -> Linear:
    """A plain float :class:`Linear` computing what ``layer`` computes: W + scaling B A, the same bias."""
    with torch.no_grad():
        weight = layer.weight.float()
        out = Linear(layer.in_features, layer.out_features, bias=layer.bias is not None, device=weight.device)
        out.weight.copy_(weight)
        if layer.bias is not None:
            out.bias.copy_(layer.bias)
    return out


class FusedLoRA(nn.Module):
    """Projections reading the same input, some of them LoRA layers, as one module: the bases fused (one product
    where their type allows, :func:`~qkv.layers.fused.fuse_linears`), then each LoRA update added to its columns."""

    def __init__(self, layers: tuple[nn.Module, ...]) -> None:
        super().__init__()
        self.bases = fuse_linears(*(layer.base if isinstance(layer, LoRALinear) else layer for layer in layers))
        self.layers = nn.ModuleList(layers)
        starts = [0]
        for layer in layers:
            starts.append(starts[-1] + cast(int, layer.out_features))
        self.columns = [(start, end) for start, end in zip(starts, starts[1:], strict=False)]

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.shape[-1])  # (n, d_in)
        out = self.bases(rows)  # (n, sum d_out): a new tensor
        for layer, (start, end) in zip(self.layers, self.columns, strict=True):
            if isinstance(layer, LoRALinear):
                out[:, start:end] = layer.add_update(out[:, start:end], rows)
        return out.view(*x.shape[:-1], out.shape[-1])


@fuse_linears.register
def _fuse_lora(first: LoRALinear, *others: nn.Module) -> nn.Module:
    return FusedLoRA((first, *others))
