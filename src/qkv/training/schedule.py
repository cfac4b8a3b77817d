"""Learning-rate schedules, as plain functions of the step (nothing to save for an exact resume).

- warmup + cosine (GPT-2, nanoGPT): rise linearly to ``lr`` over ``warmup`` steps, then follow half a
  cosine down to ``min_lr`` at the last step.
- Noam (the paper, section 5.3): lr = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), a linear warmup
  followed by decay proportional to the inverse square root of the step; ``lr`` scales it (``lr`` = 1
  is the paper's formula; the peak is then d_model^-0.5 * warmup^-0.5).
- constant, after the same linear warmup.
- linear (word2vec, gensim): after the warmup, fall in a straight line from ``lr`` towards ``min_lr``,
  reaching lr - (lr - min_lr) (total - 1) / total at the last step, as gensim's alpha does by words done.

With ``--max-time`` a run may stop long before ``--steps``: a schedule spanning --steps would then stop in its
warmup (a translator given 60 s stayed under its 200-step warmup of 1,500 steps). :func:`fit_to_time` measures
the first steps and shrinks the schedule (its length and its warmup, in proportion) to the steps that fit.
"""

from __future__ import annotations

import math


def warmup_cosine(step: int, *, lr: float, min_lr: float, warmup: int, total: int) -> float:
    """Learning rate at ``step`` (0-based) of a ``total``-step run."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - 1 - warmup))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def noam(step: int, *, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """The paper's schedule: scale * d_model^-0.5 * min(n^-0.5, n * warmup^-1.5) with n = step + 1."""
    n = step + 1
    return scale * d_model**-0.5 * min(n**-0.5, n * max(1, warmup) ** -1.5)


def constant(step: int, *, lr: float, warmup: int) -> float:
    return lr * min(1.0, (step + 1) / warmup) if warmup else lr


def linear(step: int, *, lr: float, min_lr: float, warmup: int, total: int) -> float:
    """lr - (lr - min_lr) * progress, progress = (step - warmup) / (total - warmup), after a linear warmup."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr - (lr - min_lr) * progress


def learning_rate(
    step: int, *, schedule: str, lr: float, min_lr: float, warmup: int, total: int, d_model: int
) -> float:
    """Dispatch on the schedule's name ("cosine", "noam", "constant" or "linear")."""
    if schedule == "cosine":
        return warmup_cosine(step, lr=lr, min_lr=min_lr, warmup=warmup, total=total)
    if schedule == "noam":
        return noam(step, d_model=d_model, warmup=warmup, scale=lr)
    if schedule == "constant":
        return constant(step, lr=lr, warmup=warmup)
    if schedule == "linear":
        return linear(step, lr=lr, min_lr=min_lr, warmup=warmup, total=total)
    raise ValueError(f"unknown schedule {schedule!r}")


FIT_AFTER = 10
"""Steps a session times before it fits the schedule to --max-time (the first step, which may compile, not counted)."""


def fit_to_time(step: int, rate: float, remaining: float, *, steps: int, warmup: int) -> tuple[int, int] | None:
    """The schedule's (length, warmup) for a run at ``step`` that makes ``rate`` steps a second and may run
    ``remaining`` seconds more: the steps that fit (a tenth of the time kept for evaluations), when fewer than
    ``steps``, and the warmup shrunk in proportion; None when every step fits."""
    if not rate > 0:
        return None
    fits = step + int(rate * max(0.0, remaining) * 0.9)
    if fits >= steps:
        return None
    fits = max(fits, step + 1)
    return fits, min(warmup, max(1, round(warmup * fits / steps))) if warmup else 0


def duration(minutes: float) -> str:
    """--max-time as a person writes it: 20s, 10 min, 1.5 h."""
    if minutes < 1:
        return f"{minutes * 60:.0f}s"
    return f"{minutes:g} min" if minutes < 120 else f"{minutes / 60:g} h"
