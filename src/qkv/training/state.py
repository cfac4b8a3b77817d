"""What a training run knows besides its weights (:class:`TrainState`, saved with every checkpoint), what one
call of the loop carries from step to step (:class:`LoopState`), what it reports when it ends
(:class:`TrainResult`), and the error of a run whose loss stopped being finite."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qkv.errors import QkvError
from qkv.training.loss_window import LossWindow


class TrainingDiverged(QkvError):
    """The loss became NaN or infinite."""


@dataclass
class LoopState:
    """What :meth:`~qkv.training.trainer.Trainer.fit` carries from step to step (not saved): the open loss
    window, the session's clocks (``timed_from``: after the first, untimed step) and what the bar shows."""

    window: LossWindow
    first_step: int
    session_start: float
    timed_from: float
    shown_loss: float = float("nan")
    speed: float = 0.0  # tokens/s over the last read window

    @classmethod
    def starting(cls, state: TrainState, now: float) -> LoopState:
        """The loop's state at ``state.step``: a resumed run continues the averaging window it saved, so its
        metrics rows equal an uninterrupted run's."""
        window = LossWindow(first_step=state.step + 1, loss_sum=state.window_loss_sum, steps=state.window_steps)
        return cls(window, first_step=state.step + 1, session_start=now, timed_from=now)


@dataclass
class TrainState:
    """What the loop knows besides the weights: saved with every checkpoint."""

    step: int = 0
    best: float | None = None
    evals_since_best: int = 0
    tokens: int = 0
    elapsed: float = 0.0
    last_eval: dict[str, float] = field(default_factory=dict)
    before: dict[str, float] = field(default_factory=dict)  # the evaluation before the first step (fine-tuning)
    # The loss window since the last metrics row (sum and count), so a resumed run logs the same mean loss.
    window_loss_sum: float = 0.0
    window_steps: int = 0
    # --max-time: the steps the learning-rate schedule spans and its warmup, fitted to the time (None: --steps).
    schedule_steps: int | None = None
    schedule_warmup: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def result(self, stopped: str, run_dir: Path, *, compile_seconds: float, metric: str) -> TrainResult:
        """What the run reports when the loop ends (``stopped``: why)."""
        return TrainResult(
            self.step,
            stopped,
            self.best,
            self.last_eval,
            run_dir,
            tokens=self.tokens,
            train_seconds=self.elapsed,
            compile_seconds=compile_seconds,
            metric=metric,
            before=self.before,
        )


@dataclass
class TrainResult:
    step: int
    stopped: str  # "finished", "interrupted", "early stop" or "time limit"
    best: float | None
    last_eval: dict[str, float]
    run_dir: Path
    tokens: int = 0  # training tokens processed over the whole run (all processes)
    train_seconds: float = 0.0  # time in training steps, without evaluations and checkpoints
    compile_seconds: float = 0.0  # with torch.compile: the first step of this session (mostly compiling)
    metric: str = ""  # what ``best`` measures: the task's metric, e.g. "val_loss", "bleu" or "exact_match"
    before: dict[str, float] = field(default_factory=dict)  # the evaluation before the first step, if made
