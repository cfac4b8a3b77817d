"""How much arithmetic a training step does, for model FLOPs utilisation (MFU).

Per token, a forward pass does about 2 multiply-adds per parameter (2N FLOPs) and the backward pass twice
that (4N), so training costs 6N FLOPs per token; attention adds 12 * n_layers * d_model * T for the
Q K^T and weights x V products (the PaLM appendix B / nanoGPT estimate). Tables that are only looked up
are not matmuls, so they are not counted in N: learned positions, and the token embedding W_E when W_U is
a matrix of its own (tied, the one matrix is the unembedding's and counts once).

The Llama family needs nothing more: N already holds the gated feed-forward's third matrix (3 d_model d_ff
per block instead of 2) and grouped-query attention's narrower W_k and W_v (2 d_model h_kv d_k instead of
2 d_model^2); the attention products stay 12 L d T, since each of the h query heads still scores T keys
of d_k numbers and sums T values of d_k numbers, whichever key/value head it shares.
"""

from __future__ import annotations

import time
from typing import cast

import torch

from qkv.models.family import family_of
from qkv.models.gpt import GPT


def training_flops_per_token(model: GPT) -> float:
    """6 N + 12 L d T for a GPT or a Llama (N: parameters that take part in matmuls; see the module
    docstring)."""
    config = model.config
    n = model.num_parameters()
    if family_of(model).positions(config) == "learned":  # W_pos is a lookup table, not a matmul
        n -= cast(torch.nn.Embedding, model.embedding.positional_encoding).weight.numel()
    if not model.unembedding.tied:  # W_E is a lookup table; W_U, a matrix of its own, is the matmul
        n -= model.embedding.token_embedding.weight.numel()
    return 6 * n + 12 * config.n_layers * config.d_model * config.context_length


def matmul_peak_flops(
    *, size: int = 2048, seconds: float = 1.0, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> float:
    """The best FLOP/s of repeated ``size`` x ``size`` matmuls on ``device`` over about ``seconds``.

    The device's own peak, measured in the run that uses it (for MFU), not a figure from a data sheet. On
    CUDA each timing waits for the GPU (``torch.cuda.synchronize``); use a large ``size`` (8192) there.
    """
    device = torch.device(device)
    wait = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    for _ in range(3):
        a @ b
    wait()
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        for _ in range(5):
            a @ b
        wait()
        best = max(best, 5 * 2 * size**3 / (time.perf_counter() - start))
    return best
