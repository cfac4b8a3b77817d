"""Progress of a pass over a corpus: how much of the input is read, MB/s of text, tokens/s and the ETA.

A rich progress bar on a terminal; elsewhere (logs, pipes) a plain line every :data:`LOG_SECONDS`. The bar's
100% is the size of the input files on disk (compressed bytes for a compressed file), so the ETA holds for
any format; when the size is unknown (a streamed Hugging Face dataset) the bar shows rates only.
"""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

LOG_SECONDS = 10.0
"""Without a terminal, one progress line is printed at most this often."""


def size_text(n_bytes: float) -> str:
    """A size for people: '9.8 kB', '512.0 MB', '1.2 GB'."""
    for unit, size in (("GB", 1e9), ("MB", 1e6)):
        if n_bytes >= size / 10:
            return f"{n_bytes / size:,.1f} {unit}"
    return f"{n_bytes / 1e3:,.1f} kB"


def _count(n: float) -> str:
    """1234567 -> '1.2M'."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


class DataProgress:
    """``update(position, text_bytes, tokens)`` with running totals; ``close()`` returns the rates."""

    def __init__(self, phase: str, total: int | None, *, enabled: bool = True, tokens: bool = True) -> None:
        self.phase, self.total, self.enabled, self.show_tokens = phase, total, enabled, tokens
        self.started = self.last_log = time.perf_counter()
        self.position = self.text_bytes = self.tokens = 0
        self.console = Console(stderr=True)
        self.progress: Progress | None = None
        if enabled and self.console.is_terminal:
            columns = [TextColumn(f"[bold]{phase:<8}"), BarColumn(), TaskProgressColumn()]
            columns.append(TextColumn("{task.fields[mb]} MB/s"))
            if tokens:
                columns.append(TextColumn("{task.fields[tok]} tokens/s"))
            columns += [TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn()]
            self.progress = Progress(*columns, console=self.console)
            self.task = self.progress.add_task(phase, total=total, mb="-", tok="-")
            self.progress.start()

    def rates(self) -> tuple[float, float, float]:
        """(seconds so far, MB/s of text, tokens/s)."""
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        return elapsed, self.text_bytes / 1e6 / elapsed, self.tokens / elapsed

    def update(self, position: int, text_bytes: int, tokens: int = 0) -> None:
        self.position, self.text_bytes, self.tokens = position, text_bytes, tokens
        if not self.enabled:
            return
        elapsed, mb_s, tok_s = self.rates()
        if self.progress is not None:
            self.progress.update(self.task, completed=position, mb=f"{mb_s:,.1f}", tok=_count(tok_s))
        elif time.perf_counter() - self.last_log >= LOG_SECONDS:
            self.last_log = time.perf_counter()
            print(self._line(elapsed, mb_s, tok_s), file=sys.stderr, flush=True)

    def _line(self, elapsed: float, mb_s: float, tok_s: float) -> str:
        done = f" {100 * self.position / self.total:3.0f}%" if self.total else ""
        line = f"{self.phase}{done}: {size_text(self.text_bytes)} of text at {mb_s:,.1f} MB/s"
        if self.show_tokens:
            line += f", {_count(self.tokens)} tokens at {_count(tok_s)} tokens/s"
        if self.total and self.position:
            line += f", ETA {elapsed * (self.total - self.position) / self.position:,.0f}s"
        return line

    def note(self, text: str) -> None:
        if not self.enabled:
            return
        if self.progress is not None:
            self.progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> tuple[float, float, float]:
        if self.progress is not None:
            if self.total:
                self.progress.update(self.task, completed=self.total)
            self.progress.stop()
            self.progress = None
        return self.rates()
