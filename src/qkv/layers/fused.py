"""Projections that read the same input, as one product: [x W_q^T, x W_k^T, x W_v^T] = x [W_q; W_k; W_v]^T.

Decoding one token reads every weight matrix once per token, and each product costs a fixed overhead on
top of the matrix read (a kernel launch on a GPU, several dispatches on a CPU). Stacking W_q, W_k and W_v
into one (d_model + 2 h_kv d_k, d_model) matrix (3 d_model rows unless attention is grouped) turns three
products into one; every output is the same dot product as before.

:func:`fuse_linears` is the one place that knows how to stack projections. It dispatches on the type of
the modules (``functools.singledispatch``): qkv's :class:`~qkv.layers.linear.Linear` (and any plain
``nn.Linear``) gets a stacked copy of the weights; any other module with the same call signature (an int8
linear, say) falls back to :class:`ConcatenatedProjections`, which calls each module and concatenates
(correct, not faster) until its type registers its own rule::

    @fuse_linears.register
    def _(first: Int8Linear, *others: nn.Module) -> nn.Module: ...

The stacked weights are a copy, made once per model by the fast decoding step (:mod:`qkv.decoding.fast_step`),
which rebuilds it when the model's parameters change.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from qkv.layers.linear import Linear


class ConcatenatedProjections(nn.Module):
    """Calls each projection and concatenates the outputs on the last axis: (..., d_in) -> (..., sum d_out)."""

    def __init__(self, projections: tuple[nn.Module, ...]) -> None:
        super().__init__()
        self.projections = nn.ModuleList(projections)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([projection(x) for projection in self.projections], dim=-1)


@functools.singledispatch
def fuse_linears(first: nn.Module, *others: nn.Module) -> nn.Module:
    """One module computing ``cat([m(x) for m in (first, *others)], -1)``; one product where the types allow."""
    return ConcatenatedProjections((first, *others))


@fuse_linears.register
def _fuse_nn_linear(first: nn.Linear, *others: nn.Module) -> nn.Module:
    modules = (first, *others)
    linears = [m for m in modules if isinstance(m, nn.Linear) and type(m) in (nn.Linear, Linear)]
    if len(linears) < len(modules) or any(
        (m.bias is None) != (first.bias is None) or m.in_features != first.in_features for m in linears
    ):
        return ConcatenatedProjections(modules)
    weight = first.weight
    fused = Linear(
        first.in_features,
        sum(m.out_features for m in linears),
        bias=first.bias is not None,
        device=weight.device,
        dtype=weight.dtype,
    )
    with torch.no_grad():
        torch.cat([m.weight for m in linears], out=fused.weight)  # (sum d_out, d_in)
        if fused.bias is not None:
            torch.cat([m.bias for m in linears], out=fused.bias)
    return fused.requires_grad_(False)
