"""The C library's scan of a step's logits against PyTorch: torch.argmax (ties to the first; -1 for a row with NaN
or inf) and the finiteness a float64 sum tells, and the greedy tokens through it."""

from __future__ import annotations

import pytest
import torch

from qkv import native
from qkv.decoding import sampling
from qkv.native import logit_scan
from qkv.native.kernels import built

pytestmark = pytest.mark.skipif(
    native.library() is None or not built(), reason="no native library with AVX-512: PyTorch scans the logits"
)


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("vocab", [1, 5, 16, 17, 31, 1000, 50257])
def test_the_argmax_is_torchs_ties_and_tails_included(rows: int, vocab: int) -> None:
    torch.manual_seed(vocab + rows)
    logits = torch.randn(rows, vocab)
    ties = torch.randint(0, 3, (rows, vocab)).float()  # many equal largest values, in every lane and the tail
    for x in (logits, ties, -ties, torch.full((rows, vocab), -torch.inf), logits.round()):
        finite, ids = logit_scan.scan(x.contiguous())
        rows_finite = torch.isfinite(x).all(dim=-1)
        assert torch.equal(ids, torch.where(rows_finite, x.argmax(dim=-1), -1)), (x, ids)  # -1: NaN or inf
        assert finite == bool(rows_finite.all())


@pytest.mark.parametrize("bad", [torch.nan, torch.inf, -torch.inf])
@pytest.mark.parametrize("column", [0, 15, 16, 40_000, 50_256])  # first lane, a vector's last, the tail's last
def test_one_nan_or_infinity_anywhere_is_found(bad: float, column: int) -> None:
    logits = torch.randn(4, 50257)
    assert logit_scan.scan(logits, argmax=False) == (True, None)
    for row in range(4):
        spoiled = logits.clone()
        spoiled[row, column] = bad
        assert logit_scan.scan(spoiled)[0] is False
        assert sampling.scan_logits(spoiled) == (False, None)
        assert torch.equal(sampling.greedy(spoiled), spoiled.argmax(dim=-1))  # torch's answer, NaN rows too
    assert sampling.scan_logits(logits) == (True, None)


def test_what_it_does_not_take_goes_to_pytorch(monkeypatch) -> None:
    logits = torch.randn(2, 300)
    assert logit_scan.applies(logits)
    for other in (logits.double(), logits.bfloat16(), logits[:, ::2], logits[0], torch.empty(2, 0)):
        assert not logit_scan.applies(other)
    assert torch.equal(sampling.greedy(logits[:, ::2]), logits[:, ::2].argmax(dim=-1))  # PyTorch's, the same
    assert sampling.scan_logits(logits.double())[0] and not sampling.scan_logits(logits.double().log())[0]
    finite, ids = sampling.scan_logits(logits.double(), argmax=True)  # PyTorch's road, both answers
    assert finite and torch.equal(ids, logits.argmax(dim=-1))
    calls = []
    monkeypatch.setattr(logit_scan, "scan", lambda *a, **k: calls.append(a) or (True, torch.zeros(2, dtype=torch.long)))
    assert sampling.greedy(logits).tolist() == [0, 0] and len(calls) == 1  # the C scan's answer is what it returns
    assert sampling.sample_next(logits, temperature=0.0).tolist() == [0, 0] and len(calls) == 2
