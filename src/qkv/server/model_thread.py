"""One thread for all of the server's model work: every forward pass, decoding step and beam search.

Torch's CPU operators run on OpenMP (libgomp on Linux). Every thread that starts a parallel operator becomes
the master of a team of worker threads of its own. Once a process holds more such threads than the machine
has cores (two masters with two threads each, on two cores), libgomp stops letting the idle workers spin
between operators, and every operator waits for its workers to be woken. A decoding step is hundreds of
short operators, so the same work runs markedly slower from a second thread (docs/serve.md, "One model
thread", has the measurements).

So the server's event loop and its helper threads only parse, tokenize and stream, and the model runs in
this one thread: queued jobs (a translation batch, a next-token pass, a sequential generation's next
token) one after another, and between them, when a batch scheduler is attached, its decoding steps (jobs
and steps take turns, so neither starves the other). On two cores nothing is lost: two forward passes at
once only share the cores. :func:`release_openmp_threads` lets the thread that loaded the model give its
team back, so that the model thread is the only master left.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import ctypes
import os
import threading
from collections import deque
from collections.abc import Callable

from qkv.server.metrics import LOG


class ModelThread:
    """A queue of jobs run by one daemon thread, started on first use, plus an optional background loop."""

    def __init__(self, name: str = "qkv-model") -> None:
        self.name = name
        self.cond = threading.Condition()  # guards the jobs, and the background's own queue (it shares this lock)
        self._jobs: deque[tuple[Callable, tuple, concurrent.futures.Future]] = deque()
        self._has_work: Callable[[], bool] = lambda: False
        self._run_once: Callable[[], None] = lambda: None
        self._thread: threading.Thread | None = None
        self._stopped = False

    def attach(self, has_work: Callable[[], bool], run_once: Callable[[], None]) -> None:
        """A background loop (the batch scheduler): ``run_once`` (one step) runs whenever ``has_work()``,
        checked with :attr:`cond` held, says so; between steps, the queued jobs run."""
        self._has_work, self._run_once = has_work, run_once

    def submit(self, fn: Callable, *args) -> concurrent.futures.Future:
        """Queue ``fn(*args)``, to run in the caller's context (its context variables: the request's notes);
        its result (or exception) arrives in the returned future."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        context = contextvars.copy_context()
        with self.cond:
            if self._stopped:
                raise RuntimeError("the server is stopping")
            self._jobs.append((context.run, (fn, *args), future))
            self._start()
            self.cond.notify()
        return future

    async def run(self, fn: Callable, *args):
        """``fn(*args)`` in the model thread, awaited from the event loop."""
        return await asyncio.wrap_future(self.submit(fn, *args))

    def wake(self) -> None:
        """Tell the thread the background has work (call with :attr:`cond` held, or take it here)."""
        with self.cond:
            self._start()
            self.cond.notify()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        step_next = False  # jobs and background steps take turns
        while True:
            with self.cond:
                while not self._jobs and not self._has_work() and not self._stopped:
                    self.cond.wait()
                if self._stopped:
                    return
                background = self._has_work()
                job = None if (step_next and background) or not self._jobs else self._jobs.popleft()
            if job is None:
                step_next = False
                try:
                    self._run_once()
                except Exception:  # noqa: BLE001 - the loop must outlive any one failure; the rows were told
                    LOG.exception("qkv serve: the decoding loop failed a step")
                continue
            step_next = background
            fn, args, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as error:  # noqa: BLE001 - handed to the caller
                future.set_exception(error)

    def stop(self) -> None:
        with self.cond:
            self._stopped = True
            self.cond.notify()


def release_openmp_threads() -> bool:
    """Free the OpenMP worker threads of the calling thread (``omp_pause_resource_all``, OpenMP 5), so that
    a thread which loaded a model and now only serves HTTP no longer counts as a second master. False when
    the process has no libgomp with that function (then there is nothing to do)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in os.path.basename(line.split()[-1])}
    except OSError:
        return False
    released = False
    for path in paths:
        try:
            runtime = ctypes.CDLL(path)
            released |= runtime.omp_pause_resource_all(1) == 0  # omp_pause_soft: the threads go, settings stay
        except (OSError, AttributeError):
            continue
    return released
