"""The fused unembedding and cross-entropy equals F.cross_entropy over F.linear's logits: the loss and the
gradients of the hidden states, W_U and b, with rows ignored, in chunks of any size, and without gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv.layers import linear_cross_entropy as module
from qkv.layers.linear_cross_entropy import linear_cross_entropy


@pytest.mark.parametrize("chunk", [7 * 50, 1 << 22])  # 7 rows per chunk (the last one short), or all at once
@pytest.mark.parametrize("bias", [True, False])
def test_equals_cross_entropy_of_the_logits_with_its_gradients(monkeypatch, chunk: int, bias: bool) -> None:
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", chunk)
    torch.manual_seed(0)
    hidden = torch.randn(3, 10, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    b = torch.randn(50, dtype=torch.float64, requires_grad=True) if bias else None
    targets = torch.randint(0, 50, (3, 10))
    targets[0, :4] = -100  # not counted, as chat data's user turns
    fused = linear_cross_entropy(hidden, weight, b, targets)
    (fused * 3).backward()
    got = [t.grad.clone() for t in (hidden, weight, b) if t is not None]
    for t in (hidden, weight, b):
        if t is not None:
            t.grad = None
    reference = F.cross_entropy(F.linear(hidden, weight, b).flatten(0, 1), targets.flatten(), ignore_index=-100)
    (reference * 3).backward()
    torch.testing.assert_close(fused, reference)
    for mine, theirs in zip(got, [t.grad for t in (hidden, weight, b) if t is not None], strict=True):
        torch.testing.assert_close(mine, theirs)


def test_frozen_weights_get_no_gradient_and_no_grad_mode_only_measures() -> None:
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    weight = torch.randn(30, 8)
    targets = torch.randint(0, 30, (2, 5))
    linear_cross_entropy(hidden, weight, None, targets).backward()
    assert hidden.grad is not None and weight.grad is None
    reference = hidden.detach().clone().requires_grad_(True)  # dL/dh from the packed W^T: F.linear's gradient
    F.cross_entropy(F.linear(reference, weight).flatten(0, 1), targets.flatten()).backward()
    torch.testing.assert_close(hidden.grad, reference.grad, atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight, None, targets)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, F.cross_entropy(F.linear(hidden, weight).flatten(0, 1), targets.flatten()))


def test_a_frozen_unembedding_under_bfloat16_autocast_gives_autocasts_loss_and_gradient(monkeypatch) -> None:
    """LoRA's W_U under CPU autocast (bfloat16): the logits of its bfloat16 copy, as autocast's F.linear makes them;
    the loss and dL/dh within a bfloat16 step of the reference's."""
    calls, copies = [], module.bfloat16_weight
    monkeypatch.setattr(module, "bfloat16_weight", lambda w: calls.append(1) or copies(w))
    torch.manual_seed(0)
    hidden = torch.randn(4, 12, 32, requires_grad=True)
    reference_hidden = hidden.detach().clone().requires_grad_(True)
    weight, targets = torch.randn(90, 32), torch.randint(0, 90, (4, 12))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = linear_cross_entropy(hidden, weight, None, targets)
        logits = F.linear(reference_hidden, weight)
    reference = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    fused.backward()
    reference.backward()
    assert calls and weight.grad is None
    torch.testing.assert_close(fused, reference, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(hidden.grad, reference_hidden.grad, atol=2e-3, rtol=2e-2)


@pytest.mark.parametrize("rows", [0, 3, 30])
def test_a_trained_float32_unembedding_is_packed_once_for_all_its_chunks(monkeypatch, rows: int) -> None:
    """Full fine-tuning's W_U (it takes a gradient) in float32 over several chunks: one packed copy made for the
    call (none for a single chunk), and the loss and every gradient are F.cross_entropy's."""
    from qkv.layers import linear as linear_module

    if not linear_module.packable(torch.zeros(2, 2)):
        pytest.skip("this torch has no oneDNN linear")
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 7 * 40)  # 7 rows a chunk
    made, real = [], module.packed_now
    monkeypatch.setattr(module, "packed_now", lambda w: made.append(1) or real(w))
    torch.manual_seed(0)
    hidden = torch.randn(rows, 16, requires_grad=True)
    weight = torch.randn(40, 16, requires_grad=True)
    b = torch.randn(40, requires_grad=True)
    targets = torch.randint(0, 40, (rows,))
    fused = linear_cross_entropy(hidden, weight, b, targets)
    fused.backward()
    mine = [t.grad.clone() for t in (hidden, weight, b)]
    assert len(made) == (1 if rows > 7 else 0)
    for t in (hidden, weight, b):
        t.grad = None
    reference = F.cross_entropy(F.linear(hidden, weight, b), targets) if rows else (hidden.sum() + weight.sum()) * 0
    reference.backward()
    theirs = [t.grad if t.grad is not None else torch.zeros_like(t) for t in (hidden, weight, b)]
    torch.testing.assert_close(fused, reference.detach() if rows else torch.zeros(()), atol=1e-5, rtol=1e-5)
    for got, want in zip(mine, theirs, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
