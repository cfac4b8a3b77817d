"""Calibrated int8 rounding (GPTQ): pick each int8 weight to minimise the layer's output error on real inputs.

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
channel, so the format, the kernels and the memory are exactly those of plain int8: only which integer each
weight becomes changes. The columns are processed in blocks whose updates to the later columns are one matrix
product (the "lazy batch" of the paper).

:func:`input_hessians` collects H for named layers by running the float model on calibration inputs;
:func:`gptq_round` rounds one matrix; :func:`qkv.quantization.quantize_model` takes ``calibration=`` to use
both. What it buys is measured by bench/quantize.py (docs/deploy.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

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


@torch.no_grad()
def gptq_round(weight: Tensor, hessian: Tensor, scale: Tensor, *, damping: float = DAMPING) -> Tensor:
    """int8 Q (N, K) for ``weight`` (N, K) with per-row ``scale`` (N,), minimising the output error under H (K, K).

    Inputs that never vary (a zero diagonal entry of H) carry no information: their weights are rounded to
    nearest, as no error can be moved onto them usefully.
    """
    w = weight.detach().double().clone()  # (N, K): the not-yet-rounded weights, updated as columns are rounded
    n_in = w.shape[1]
    dead = torch.diagonal(hessian) <= 0
    hessian = hessian.double().clone()
    hessian[dead, dead] = 1.0  # an unused input: H stays invertible and its column is rounded independently
    upper = _upper_inverse_cholesky(hessian, damping)  # (K, K)
    s = scale.detach().double()[:, None]  # (N, 1)
    q = torch.empty_like(w)
    for start in range(0, n_in, BLOCK):
        stop = min(start + BLOCK, n_in)
        block, errors = w[:, start:stop], torch.empty(w.shape[0], stop - start, dtype=w.dtype)
        u = upper[start:stop, start:stop]
        for j in range(stop - start):
            rounded = torch.round(block[:, j : j + 1] / s).clamp_(-Q_MAX, Q_MAX)  # (N, 1)
            q[:, start + j : start + j + 1] = rounded
            error = (block[:, j : j + 1] - rounded * s) / u[j, j]  # (N, 1)
            block[:, j:] -= error * u[j : j + 1, j:]  # the rest of this block absorbs the error
            errors[:, j : j + 1] = error
        w[:, stop:] -= errors @ upper[start:stop, stop:]  # and the later blocks, in one product
    return q.to(torch.int8).contiguous()
