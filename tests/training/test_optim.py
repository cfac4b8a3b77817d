"""The optimizers: AdamW groups, Muon's orthogonalised updates, and the combined Muon + AdamW."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qkv.models import GPT
from qkv.training.muon import Muon, orthogonalize
from qkv.training.optim import make_optimizer
from tests.conftest import tiny_gpt


def _small_gpt() -> GPT:
    """The shared tiny GPT, smaller, float32 and in training mode, as an optimizer sees it."""
    return tiny_gpt(vocab_size=20, context_length=8, d_model=16, n_heads=2, seed=0, dtype=torch.float32,
                    init_std=None).train()  # fmt: skip


def test_newton_schulz_gives_nearly_orthogonal_matrices() -> None:
    torch.manual_seed(0)
    for shape in ((32, 32), (64, 16), (16, 48)):
        singular = torch.linalg.svdvals(orthogonalize(torch.randn(*shape)))
        assert 0.6 < singular.min() and singular.max() < 1.25  # the quintic iteration's band around 1
    stack = torch.randn(3, 40, 12)
    torch.testing.assert_close(orthogonalize(stack), torch.stack([orthogonalize(m) for m in stack]), atol=1e-5, rtol=0)
    u, _, vh = torch.linalg.svd(stack[0], full_matrices=False)
    assert F.cosine_similarity(orthogonalize(stack[0]).flatten(), (u @ vh).flatten(), dim=0) > 0.98


def test_one_muon_step_by_hand() -> None:
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(24, 8))
    before = weight.detach().clone()
    weight.grad = torch.randn(24, 8)
    Muon([weight], lr=0.1, momentum=0.9).step()
    direction = weight.grad + 0.9 * weight.grad  # buffer = g on the first step; Nesterov adds momentum * buffer
    expected = before - 0.1 * (24 / 8) ** 0.5 * orthogonalize(direction)
    torch.testing.assert_close(weight.detach(), expected)


def test_muon_takes_the_linear_matrices_and_adamw_the_rest() -> None:
    model = _small_gpt()
    optimizer = make_optimizer(model, lr=1e-3, weight_decay=0.0, betas=(0.9, 0.99), device_type="cpu", kind="muon")
    muon_params = {id(p) for g in optimizer.param_groups if g["muon"] for p in g["params"]}
    linears = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert muon_params == linears and len(linears) == 2 * 6  # W_q, W_k, W_v, W_o, W_1, W_2 per block
    assert id(model.embedding.token_embedding.weight) not in muon_params
    every = [p for g in optimizer.param_groups for p in g["params"]]
    assert len(every) == len(list(model.parameters()))  # each parameter exactly once


def test_the_adamw_half_equals_torch_adamw() -> None:
    a, b = _small_gpt(), _small_gpt()
    ours = make_optimizer(a, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99), device_type="cpu", kind="muon")
    reference = torch.optim.AdamW(
        [
            {"params": [b.embedding.token_embedding.weight], "weight_decay": 0.1},
            {"params": [p for n, p in b.named_parameters() if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=1e-2,
        betas=(0.9, 0.99),
    )
    for group in ours.param_groups:
        group["lr"] = 1e-2 * group["lr_scale"]
    ids = torch.randint(0, 20, (4, 8))
    for _ in range(3):
        for model, optimizer in ((a, ours), (b, reference)):
            F.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
            optimizer.step()
            optimizer.zero_grad()
        with torch.no_grad():  # the reference only moves the AdamW half; copy the Muon half across
            for (_, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
                if pa.dim() == 2 and pa is not a.embedding.token_embedding.weight:
                    pb.copy_(pa)
    torch.testing.assert_close(a.embedding.token_embedding.weight, b.embedding.token_embedding.weight)
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        if pa.dim() < 2:
            torch.testing.assert_close(pa, pb, msg=name)
