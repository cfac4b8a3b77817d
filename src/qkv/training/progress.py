"""A progress bar with loss, learning rate, tokens/s and ETA (rich), or plain log lines when the output is
not a terminal (CI logs, pipes), so the run can be followed either way."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class TrainingProgress:
    """``update`` once per step; ``note`` prints a line above the bar (evaluations, checkpoints)."""

    def __init__(self, total: int, initial: int = 0, *, enabled: bool = True, log_interval: int = 10) -> None:
        self.total, self.enabled, self.log_interval = total, enabled, log_interval
        self.console = Console(stderr=True)
        self.interactive = enabled and self.console.is_terminal
        self.started = time.perf_counter()
        self.first_step = initial
        self.progress: Progress | None = None
        if self.interactive:
            self.progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("loss [cyan]{task.fields[loss]}"),
                TextColumn("lr {task.fields[lr]}"),
                TextColumn("{task.fields[speed]} tok/s"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.task = self.progress.add_task("train", total=total, completed=initial, loss="-", lr="-", speed="-")
            self.progress.start()

    def update(self, step: int, *, loss: float, lr: float, tokens_per_s: float) -> None:
        """Report that ``step`` (1-based count of finished steps) is done."""
        if not self.enabled:
            return
        if self.progress is not None:
            self.progress.update(
                self.task, completed=step, loss=f"{loss:.4f}", lr=f"{lr:.2e}", speed=f"{tokens_per_s:,.0f}"
            )
        elif step % self.log_interval == 0 or step == self.total:
            done = step - self.first_step
            elapsed = time.perf_counter() - self.started
            eta = elapsed / max(done, 1) * (self.total - step)
            print(
                f"step {step}/{self.total}  loss {loss:.4f}  lr {lr:.2e}  {tokens_per_s:,.0f} tok/s  "
                f"elapsed {elapsed:,.0f}s  ETA {eta:,.0f}s",
                file=sys.stderr,
                flush=True,
            )

    def expect(self, total: int) -> None:
        """The run will stop at ``total`` steps (--max-time fits fewer than --steps): the bar and the ETA follow."""
        self.total = total
        if self.progress is not None:
            self.progress.update(self.task, total=total)

    def note(self, text: str) -> None:
        if not self.enabled:
            return
        if self.progress is not None:
            self.progress.console.print(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
