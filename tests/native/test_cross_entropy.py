"""The C library's cross-entropy of a chunk of logits and its gradient against ``F.cross_entropy`` in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv import native
from qkv.native import cross_entropy as native_cross_entropy

pytestmark = pytest.mark.skipif(
    native.library() is None or not native_cross_entropy.built(), reason="no library with AVX-512: PyTorch computes it"
)


@pytest.mark.parametrize(("rows", "vocabulary"), [(1, 1), (3, 17), (7, 50), (5, 4099), (0, 32)])
@pytest.mark.parametrize("gradient", [True, False])
def test_the_losses_and_gradient_are_pytorchs(rows: int, vocabulary: int, gradient: bool) -> None:
    torch.manual_seed(0)
    logits = torch.randn(rows, vocabulary) * 6
    if rows:
        logits[0, : min(3, vocabulary)] = torch.tensor([80.0, -200.0, float("-inf")])[: min(3, vocabulary)]
    targets = torch.randint(0, vocabulary, (rows,))
    keep = torch.rand(rows) < 0.7
    wide = logits.double().requires_grad_()
    each = F.cross_entropy(wide, targets, reduction="none") * keep
    (theirs,) = torch.autograd.grad(each.sum(), (wide,)) if rows else (torch.zeros(0, vocabulary, dtype=torch.float64),)
    chunk = logits.clone()
    assert native_cross_entropy.applies(chunk)
    losses = native_cross_entropy.cross_entropy_(chunk, targets, keep, gradient=gradient)
    assert losses.shape == (rows,)
    assert torch.allclose(losses.double(), each.detach(), atol=1e-5, rtol=1e-5)
    if gradient:
        assert torch.allclose(chunk.double(), theirs, atol=1e-6, rtol=1e-5), (chunk.double() - theirs).abs().max()
        assert torch.all(chunk[~keep] == 0)
    else:
        assert torch.equal(chunk, logits)  # only read


def test_a_target_outside_the_vocabulary_is_refused_before_the_library_reads_it() -> None:
    with pytest.raises(IndexError, match="outside the vocabulary of 10"):
        native_cross_entropy.cross_entropy_(
            torch.zeros(2, 10), torch.tensor([3, 10]), torch.ones(2, dtype=torch.bool), gradient=True
        )


def test_what_it_does_not_take_stays_with_pytorch() -> None:
    z = torch.randn(4, 32)
    assert native_cross_entropy.applies(z)
    assert not native_cross_entropy.applies(z.double())
    assert not native_cross_entropy.applies(z.bfloat16())
    assert not native_cross_entropy.applies(z.T)
    assert not native_cross_entropy.applies(z[0])
    assert not native_cross_entropy.applies(torch.zeros(3, 0))
