"""Tiny convergence checks: the models can actually learn (copy and reverse tasks, seconds on a CPU).

The Annotated Transformer's copy task: the encoder-decoder must reproduce its input. For the GPT the
sequence is ``digits SEP answer``; the loss is on the answer only, and greedy decoding must reproduce it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv.models import GPT, GPTConfig, Transformer, TransformerConfig

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)

DIGITS, LENGTH = 10, 5
SEP, BOS = DIGITS, DIGITS + 1


def digit_batch(n: int) -> torch.Tensor:
    return torch.randint(0, DIGITS, (n, LENGTH))


def train(model: torch.nn.Module, loss_fn, steps: int, lr: float) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    for _ in range(steps):
        loss = loss_fn()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()


def gpt_accuracy(model: GPT, task) -> float:
    digits = digit_batch(200)
    ids = torch.cat([digits, torch.full((200, 1), SEP)], dim=1)
    with torch.no_grad():
        for _ in range(LENGTH):
            next_id = model(ids, last_only=True)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, next_id], dim=1)
    return (ids[:, LENGTH + 1 :] == task(digits)).all(dim=1).float().mean().item()


@pytest.mark.parametrize("task", [lambda d: d, lambda d: d.flip(1)], ids=["copy", "reverse"])
def test_gpt_learns_to_copy_and_to_reverse(task) -> None:
    model = GPT(
        GPTConfig(vocab_size=DIGITS + 1, d_model=64, n_heads=4, n_layers=2, context_length=16, positional="learned")
    )

    def loss_fn() -> torch.Tensor:
        digits = digit_batch(64)
        seq = torch.cat([digits, torch.full((64, 1), SEP), task(digits)], dim=1)
        logits = model(seq[:, :-1])[:, LENGTH:]  # predictions for the answer positions
        return F.cross_entropy(logits.reshape(-1, DIGITS + 1), seq[:, LENGTH + 1 :].reshape(-1))

    train(model, loss_fn, steps=300, lr=3e-3)
    assert gpt_accuracy(model, task) > 0.95


def test_encoder_decoder_learns_the_copy_task() -> None:
    model = Transformer(
        TransformerConfig(
            src_vocab_size=DIGITS + 2,
            tgt_vocab_size=DIGITS + 2,
            d_model=64,
            n_heads=4,
            d_ff=128,
            n_encoder_layers=2,
            n_decoder_layers=2,
            context_length=16,
            norm_first=False,
            positional="sinusoidal",
            scale_embeddings=True,
        )
    )

    def loss_fn() -> torch.Tensor:
        src = digit_batch(64)
        tgt_in = torch.cat([torch.full((64, 1), BOS), src[:, :-1]], dim=1)  # shifted right after <bos>
        logits = model(src, tgt_in)
        return F.cross_entropy(logits.reshape(-1, DIGITS + 2), src.reshape(-1))

    train(model, loss_fn, steps=300, lr=2e-3)
    src = digit_batch(200)
    with torch.no_grad():
        memory = model.encode(src)
        out = torch.full((200, 1), BOS)
        for _ in range(LENGTH):
            out = torch.cat([out, model.decode(out, memory, last_only=True)[:, -1].argmax(-1, keepdim=True)], 1)
    assert (out[:, 1:] == src).all(dim=1).float().mean().item() > 0.95
