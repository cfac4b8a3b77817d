"""Make the next batch on another core while the current step runs.

A batch that is a pure function of its position in the stream (its words and its random draws are fixed
by the position and the seed) can be made ahead of time without changing anything: :class:`Prefetch` hands
back ``make(key)`` and starts ``make(next_key)`` on a background thread. NumPy and PyTorch release the GIL
inside their kernels, so on a machine with a spare core the batch costs the step (almost) nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)
Value = TypeVar("Value")


class Prefetch(Generic[Key, Value]):
    """``prefetch(key, next_key)`` returns ``make(key)`` (made ahead when ``key`` was the last call's
    ``next_key``) and starts making ``make(next_key)`` in the background."""

    def __init__(self, make: Callable[[Key], Value]) -> None:
        self.make = make
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[Key, Future[Value]] | None = None

    def __call__(self, key: Key, next_key: Key) -> Value:
        pending, self._pending = self._pending, None
        value = pending[1].result() if pending is not None and pending[0] == key else self.make(key)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qkv-prefetch")
        self._pending = (next_key, self._pool.submit(self.make, next_key))
        return value

    def close(self) -> None:
        """Drop what is being made and stop the background thread."""
        self._pending = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
