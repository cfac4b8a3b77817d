"""Ctrl-C during training: the first one (or SIGTERM from a scheduler) asks the trainer to stop after the
current step, with a checkpoint; a second one aborts at once (KeyboardInterrupt)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def stop_on_signals(trainer: Any) -> Iterator[None]:
    """Within this block (on the main thread), SIGINT and SIGTERM set ``trainer._stop_requested``; a second
    SIGINT raises KeyboardInterrupt. Elsewhere (another thread) signals are left as they are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):  # noqa: ANN001, ARG001
        if trainer._stop_requested:
            raise KeyboardInterrupt
        trainer._stop_requested = True

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
