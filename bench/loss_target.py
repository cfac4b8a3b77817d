"""When a training run first reaches a validation loss: the step, and the time, found without changing the run.

:class:`LossTarget` is an ``on_step`` callback for ``train_language_model``. Every ``probe_interval`` steps
it measures the validation loss on the first ``probe_batches`` of the run's own evaluation windows (cheap,
noisy); once that is within ``margin`` of the target it measures on all of the run's ``eval_batches``
windows (the protocol's evaluation) and, if that reaches the target, records the step. Probes run in eval
mode without gradients and draw no random numbers, so the run's own evaluations, losses and final figure
are the same as without them (tests/training/test_bench_train.py checks it). The time is the wall time
since the callback was made (just before training starts: tokenizer, data, model, the run's own
evaluations and checkpoints included) minus the time spent probing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class LossTarget:
    target: float
    probe_interval: int = 50
    probe_batches: int = 20
    margin: float = 0.03
    stop: bool = False  # ask the trainer to stop (with a checkpoint) once the target is reached
    started: float = field(default_factory=time.perf_counter)
    probe_seconds: float = 0.0
    step: int | None = None  # the first step whose full evaluation reached the target
    loss: float | None = None  # that evaluation
    wall_seconds: float | None = None  # wall time to that step, without probes
    train_seconds: float | None = None  # time in training steps to that step (no evaluations)

    def __call__(self, trainer, step: int, loss: Tensor) -> None:  # noqa: ANN001
        if self.step is not None or step % self.probe_interval:
            return
        start = time.perf_counter()
        if self._validation_loss(trainer, self.probe_batches) <= self.target + self.margin:
            full = self._validation_loss(trainer, None)
            if full <= self.target:
                self.step, self.loss, self.train_seconds = step, full, trainer.state.elapsed
                self.wall_seconds = start - self.started - self.probe_seconds
                if self.stop:
                    trainer.request_stop()
        self.probe_seconds += time.perf_counter() - start

    @staticmethod
    def _validation_loss(trainer, batches: int | None) -> float:  # noqa: ANN001
        """The task's evaluation on its first ``batches`` windows (None: the run's own number of them)."""
        task = trainer.task
        saved = task.eval_batches
        task.eval_batches = min(batches, saved) if batches else saved
        try:
            return trainer.evaluate()[task.metric]
        finally:
            task.eval_batches = saved

    def describe(self, reference_seconds: float | None = None) -> str:
        if self.step is None:
            return f"not reached ({self.target})"
        text = (
            f"{self.loss:.4f} <= {self.target} at step {self.step}, after {self.wall_seconds:.0f} s "
            f"(wall, without probes; {self.train_seconds:.0f} s in training steps)"
        )
        if reference_seconds:
            text += f" = {self.wall_seconds / reference_seconds:.2f}x the reference's {reference_seconds:.0f} s"
        return text
