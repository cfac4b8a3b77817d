"""The losses of the steps since they were last read, kept on the device so that the host never waits for it.

A training step leaves its loss as a 0-dim tensor on the device. Reading it (``.item()``) would make the
host wait until the device has finished the step, and the device would then sit idle while the host
prepares the next one. So the trainer keeps the losses here and reads them all at once (one wait) every
``log_interval`` steps and before an evaluation, a checkpoint or a stop; that reading is where a loss that
is not finite is found, with the step it belongs to.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class LossWindow:
    """Pending losses and learning rates (not read yet), and since the last metrics row: tokens, the sum of
    the losses read, their number and the start time."""

    first_step: int  # the step the first pending loss belongs to
    pending: list[Tensor] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    tokens: int = 0
    loss_sum: float = 0.0
    steps: int = 0
    start: float = field(default_factory=time.perf_counter)

    def add(self, loss: Tensor, lr: float, tokens: int) -> None:
        self.pending.append(loss)
        self.lrs.append(lr)
        self.tokens += tokens

    def read(self) -> tuple[float | None, tuple[int, float, float] | None]:
        """Read the pending losses (the host waits for the device here).

        Returns the last step's loss (None if nothing was pending) and, if a loss is not finite, the first
        such (step, loss, learning rate); the window is then left as it was.
        """
        values = torch.stack(self.pending).tolist() if self.pending else []
        for i, value in enumerate(values):
            if not math.isfinite(value):
                return value, (self.first_step + i, value, self.lrs[i])
        self.loss_sum += sum(values)
        self.steps += len(values)
        self.first_step += len(values)
        self.pending.clear()
        self.lrs.clear()
        return (values[-1] if values else None), None

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / max(self.steps, 1)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(time.perf_counter() - self.start, 1e-9)
