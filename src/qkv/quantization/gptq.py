"""Calibrated rounding (GPTQ): pick each int8 or int4 weight to minimise the layer's output error on real inputs.

Plain weight-only int8 (:mod:`qkv.quantization.int8_linear`) rounds every weight of row i to the nearest multiple of
its scale s_i. That minimises the error of each weight, not the error of the layer's output

    E(q) = sum_x ||x W^T - x (s q)^T||^2 = sum_i (w_i - s_i q_i)^T H (w_i - s_i q_i),   H = sum_x x x^T,

where x runs over inputs the layer sees (rows w_i, q_i of W and Q). When a few input coordinates are large
(a BERT feed-forward output matrix reads GELU activations with outlier channels), nearest rounding leaves
errors that those coordinates amplify. GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training
Quantization for Generative Pre-trained Transformers") rounds the columns j = 1..K in turn and moves each
column's rounding error onto the columns not yet rounded, in the proportions that minimise E given the
rounding so far (optimal brain surgeon on H):

    e = (w_j - s q_j) / U_jj,    w_{j+1..K} -= e U_{j, j+1..K},    U = chol(H^-1) (upper triangular),

with H damped (H + lambda mean(diag H) I) so that it is invertible. The scales stay absmax / 127 per output
channel (or per group of weights of a row, for grouped int8 layers: column j then rounds on its group's scale),
so the format, the kernels and the memory are exactly those of plain int8: only which integer each
weight becomes changes. The columns are processed in blocks whose updates to the later columns are one matrix
product (the "lazy batch" of the paper).

The same column sweep rounds int4 groups (:mod:`qkv.quantization.int4_linear`, :func:`gptq_round_groups`):
there the grid of each group (its scale and minimum) is chosen when the sweep reaches the group's first
column, from the group's weights as the earlier errors have left them, and the blocks are whole groups.

:func:`input_hessians` collects H for named layers by running the float model on calibration inputs;
:func:`gptq_round` and :func:`gptq_round_groups` round one matrix; :func:`qkv.quantization.quantize_model` takes
``calibration=`` to use both. What it buys is measured by bench/quantize.py (docs/deploy.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from qkv.quantization.int4_linear import check_group_size, group_grid, pack_nibbles, round_to_grid
from qkv.quantization.int8_linear import Q_MAX

DAMPING = 0.1  # lambda: H + lambda mean(diag H) I (0.01 in the paper; docs/deploy.md compares the two)
BLOCK = 128  # columns rounded before their error is pushed onto the later columns in one product


def input_hessians(model: nn.Module, names: Iterable[str], feed: Callable[[nn.Module], object]) -> dict[str, Tensor]:
    """H = mean over input rows of x x^T (K, K) for each named layer, from running ``feed(model)``.

    ``feed`` must run the model's own forward (the layers' ``forward``), not a fused engine that bypasses
    them. A layer that sees no input is left out of the result.
    """
    sums: dict[str, Tensor] = {}
    counts: dict[str, int] = {}
    handles = []

    def hook_for(name: str):
        def hook(module: nn.Module, inputs: tuple, output: object) -> None:
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).float()  # (rows, K)
            product = x.T @ x  # (K, K)
            sums[name] = product if name not in sums else sums[name] + product
            counts[name] = counts.get(name, 0) + x.shape[0]

        return hook

    for name in names:
        handles.append(model.get_submodule(name).register_forward_hook(hook_for(name)))
    try:
        with torch.no_grad():
            feed(model)
    finally:
        for handle in handles:
            handle.remove()
    return {name: total / counts[name] for name, total in sums.items() if counts[name] > 0}


def _upper_inverse_cholesky(hessian: Tensor, damping: float) -> Tensor:
    """U with U^T U = (H + lambda mean(diag H) I)^-1, U upper triangular (K, K), in float64."""
    h = hessian.double().clone()
    diagonal = torch.diagonal(h)
    diagonal.add_(damping * float(diagonal.mean().clamp_min(1e-12)))
    inverse = torch.cholesky_inverse(torch.linalg.cholesky(h))
    return torch.linalg.cholesky(inverse, upper=True)


def _gptq(
    weight: Tensor, hessian: Tensor, damping: float, block: int, round_column: Callable[[int, Tensor], Tensor]
) -> None:
    """Round ``weight`` (N, K) column by column, moving each column's error onto the later ones (module docstring).

    ``round_column(j, pending)`` gets the columns j.. of the current block that are not rounded yet (their
    first column is j, with the errors of the columns before it added) and returns column j on the grid
    (N, 1), recording its integers itself. Blocks start at multiples of ``block``.
    """
    w = weight.detach().double().clone()  # (N, K): the not-yet-rounded weights, updated as columns are rounded
    n_in = w.shape[1]
    dead = torch.diagonal(hessian) <= 0
    hessian = hessian.double().clone()
    hessian[dead, dead] = 1.0  # an unused input: H stays invertible and its column is rounded independently
    upper = _upper_inverse_cholesky(hessian, damping)  # (K, K)
    for start in range(0, n_in, block):
        stop = min(start + block, n_in)
        pending, errors = w[:, start:stop], torch.empty(w.shape[0], stop - start, dtype=w.dtype)
        u = upper[start:stop, start:stop]
        for j in range(stop - start):
            rounded = round_column(start + j, pending[:, j:])  # (N, 1)
            error = (pending[:, j : j + 1] - rounded) / u[j, j]  # (N, 1)
            pending[:, j:] -= error * u[j : j + 1, j:]  # the rest of this block absorbs the error
            errors[:, j : j + 1] = error
        w[:, stop:] -= errors @ upper[start:stop, stop:]  # and the later blocks, in one product


@torch.no_grad()
def gptq_round(weight: Tensor, hessian: Tensor, scale: Tensor, *, damping: float = DAMPING) -> Tensor:
    """int8 Q (N, K) for ``weight`` (N, K) with per-row ``scale`` (N,), or scales per group of g weights
    (N, K / g), minimising the output error under H (K, K).

    Inputs that never vary (a zero diagonal entry of H) carry no information: their weights are rounded to
    nearest, as no error can be moved onto them usefully.
    """
    scales = scale.detach().double()
    s = scales[:, None] if scales.dim() == 1 else scales  # (N, 1) or (N, K / g)
    group = weight.shape[1] // s.shape[1]
    q = torch.empty(weight.shape, dtype=torch.float64)

    def round_column(j: int, pending: Tensor) -> Tensor:
        step = s[:, j // group : j // group + 1]  # (N, 1): column j's scale
        q[:, j : j + 1] = torch.round(pending[:, :1] / step).clamp_(-Q_MAX, Q_MAX)
        return q[:, j : j + 1] * step

    _gptq(weight, hessian, damping, BLOCK, round_column)
    return q.to(torch.int8).contiguous()


@torch.no_grad()
def gptq_round_groups(
    weight: Tensor, hessian: Tensor, group_size: int, *, damping: float = DAMPING
) -> tuple[Tensor, Tensor, Tensor]:
    """int4 groups for ``weight`` (N, K) minimising the output error under H (K, K): (Q bytes (N, K / 2),
    s float16 (N, K / g), m float16 (N, K / g)), as :func:`~qkv.quantization.int4_linear.quantize_groups` gives.

    Each group's grid (min/max, :func:`~qkv.quantization.int4_linear.group_grid`) is chosen when its first
    column is reached, from the group's weights with the errors of the columns before it added (the
    paper's grouping). Blocks are whole groups, so a group's pending weights are all up to date.
    """
    n_out, n_in = weight.shape
    check_group_size(group_size, n_in)
    levels = torch.empty(n_out, n_in, dtype=torch.float64)
    scale = torch.empty(n_out, n_in // group_size, dtype=torch.float16)
    minimum = torch.empty_like(scale)

    def round_column(j: int, pending: Tensor) -> Tensor:
        g = j // group_size
        if j % group_size == 0:
            group = pending[:, :group_size].float()
            scale[:, g], minimum[:, g] = group_grid(group.amin(dim=1), group.amax(dim=1))
        s, m = scale[:, g : g + 1], minimum[:, g : g + 1]
        levels[:, j : j + 1] = round_to_grid(pending[:, :1, None].float(), s, m).squeeze(-1).double()
        return levels[:, j : j + 1] * s.double() + m.double()

    _gptq(weight, hessian, damping, max(BLOCK, group_size), round_column)
    return pack_nibbles(levels), scale, minimum
