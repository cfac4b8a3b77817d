"""Softmax with temperature: the seed's numbers, the limits in T, numerical stability."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from qkv.layers.softmax import log_softmax, softmax


def test_seed_000_example() -> None:
    probs = softmax(torch.tensor([2.0, 4.0, 5.0]))
    torch.testing.assert_close(probs, torch.tensor([0.03511903, 0.25949646, 0.70538451]), atol=1e-7, rtol=0)


def test_temperature_limits() -> None:
    logits = torch.tensor([1.0, 3.0, 2.0, -1.0])
    assert softmax(logits, 0.0).tolist() == [0.0, 1.0, 0.0, 0.0]
    assert softmax(logits, 1e-3)[1] > 0.999
    torch.testing.assert_close(softmax(logits, 1e6), torch.full((4,), 0.25), atol=1e-5, rtol=0)
    # lower temperature -> sharper: the top probability grows monotonically as T falls
    tops = [softmax(logits, t)[1].item() for t in (4.0, 2.0, 1.0, 0.5, 0.25)]
    assert tops == sorted(tops)


def test_ties_at_zero_temperature_share_the_mass() -> None:
    assert softmax(torch.tensor([2.0, 2.0, 1.0]), 0.0).tolist() == [0.5, 0.5, 0.0]


def test_huge_logits_stay_finite() -> None:
    probs = softmax(torch.tensor([1e30, 1e30 - 1e25, -1e30]))
    assert torch.isfinite(probs).all()
    naive = torch.exp(torch.tensor([1000.0])) / torch.exp(torch.tensor([1000.0]))
    assert torch.isnan(naive).all()  # why the max is subtracted first


@given(
    values=st.lists(st.floats(-1e4, 1e4), min_size=1, max_size=50),
    temperature=st.floats(0.05, 20.0),
)
def test_rows_sum_to_one_and_log_softmax_agrees(values, temperature) -> None:
    logits = torch.tensor(values, dtype=torch.float64)
    probs = softmax(logits, temperature)
    assert math.isclose(probs.sum().item(), 1.0, rel_tol=1e-5)
    assert torch.all(probs >= 0)
    expected = torch.log_softmax(logits / temperature, dim=-1)
    torch.testing.assert_close(log_softmax(logits, temperature), expected, atol=1e-9, rtol=1e-9)


def test_negative_temperature_is_refused() -> None:
    with pytest.raises(ValueError, match="temperature"):
        softmax(torch.zeros(3), -1.0)
