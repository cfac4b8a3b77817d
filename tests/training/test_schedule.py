"""Learning-rate schedules: warmup + cosine, and the paper's Noam schedule."""

from __future__ import annotations

import math

import pytest

from qkv.training.schedule import constant, learning_rate, linear, noam, warmup_cosine


def test_warmup_then_cosine_down_to_min_lr() -> None:
    lrs = [warmup_cosine(s, lr=1.0, min_lr=0.1, warmup=10, total=110) for s in range(110)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10], strict=True))  # rising during warmup
    assert all(a >= b for a, b in zip(lrs[10:-1], lrs[11:], strict=True))  # falling after it
    assert lrs[-1] == pytest.approx(0.1)
    assert lrs[60] == pytest.approx(0.1 + 0.5 * (1 + math.cos(math.pi * 50 / 99)) * 0.9)


def test_noam_is_the_papers_formula() -> None:
    d_model, warmup = 512, 4000
    for step in (0, 10, 3999, 4000, 20000):
        n = step + 1
        expected = d_model**-0.5 * min(n**-0.5, n * warmup**-1.5)  # Vaswani et al., eq. (3)
        assert noam(step, d_model=d_model, warmup=warmup) == pytest.approx(expected)
    peak = max(range(10000), key=lambda s: noam(s, d_model=d_model, warmup=warmup))
    assert peak == warmup - 1  # the maximum sits at the end of the warmup
    assert noam(10, d_model=512, warmup=100, scale=2.0) == pytest.approx(2 * noam(10, d_model=512, warmup=100))


def test_constant_and_dispatch() -> None:
    assert constant(0, lr=1.0, warmup=4) == 0.25 and constant(100, lr=1.0, warmup=4) == 1.0
    assert learning_rate(5, schedule="noam", lr=1.0, min_lr=0, warmup=10, total=0, d_model=64) == noam(
        5, d_model=64, warmup=10
    )
    with pytest.raises(ValueError):
        learning_rate(0, schedule="exponential", lr=1, min_lr=0, warmup=0, total=1, d_model=1)


def test_linear_falls_like_gensims_alpha() -> None:
    # gensim: alpha - (alpha - min_alpha) * progress, progress = the fraction of the words done
    common = dict(schedule="linear", lr=0.025, min_lr=1e-4, warmup=0, total=4, d_model=1)
    values = [learning_rate(s, **common) for s in range(4)]
    assert values == pytest.approx([0.025 - (0.025 - 1e-4) * s / 4 for s in range(4)])
    assert linear(5, lr=1.0, min_lr=0.0, warmup=2, total=6) == pytest.approx(0.25)
    assert linear(0, lr=1.0, min_lr=0.0, warmup=2, total=6) == pytest.approx(0.5)


def test_the_schedule_is_fitted_to_the_steps_that_fit_the_time() -> None:
    from qkv.training.schedule import duration, fit_to_time

    # 10 steps done at 5 steps/s with 100 s left: 450 more fit (a tenth kept for evaluations), so 460 of 1,500.
    assert fit_to_time(10, 5.0, 100.0, steps=1500, warmup=200) == (460, 61)  # the warmup shrunk in proportion
    assert fit_to_time(10, 5.0, 1000.0, steps=1500, warmup=200) is None  # everything fits: --steps stays
    assert fit_to_time(10, 5.0, -3.0, steps=1500, warmup=200) == (11, 1)  # out of time: the schedule ends now
    assert fit_to_time(10, 0.0, 100.0, steps=1500, warmup=200) is None
    assert fit_to_time(10, 5.0, 100.0, steps=1500, warmup=0) == (460, 0)
    assert [duration(m) for m in (1 / 3, 10, 90, 180)] == ["20s", "10 min", "90 min", "3 h"]
