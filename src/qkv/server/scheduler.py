"""How completions share the model: one decoding engine for all of them (batched), or one at a time (sequential).

``--scheduler batched`` (the default) is continuous batching over one :class:`qkv.decoding.engine.Engine`
(Orca's iteration-level scheduling, as vLLM and TGI serve): the model thread runs its loop; every choice of every
request is a row; at each pass the rows of clients that went away (or whose text hit a stop string) leave,
waiting rows join as slots free up (their prompts prefilled together), and one batched forward makes the next
token of every row. The engine returns its outputs as data, and the scheduler routes each one to its request's
queue, read by the request's handler on the event loop, which makes text of it (:mod:`qkv.server.output`), so a
stream sends a token's text as soon as the step that made it ends. The pool of slots is the bound: a request
that gets no row within ``--queue-timeout`` seconds is refused with 503, as the sequential gate refuses it.

``--scheduler sequential``: each choice generates alone (an engine of one slot), one step per model-thread job,
at most ``--max-concurrent`` requests at once (:class:`~qkv.server.limits.Gate`). Both give the same tokens for
the same request; the bench (bench/serve_load.py) runs the two side by side.

Either way :meth:`start` returns a :class:`Run`: the request's token outputs as an async iterator, :meth:`Run.stop`
for a choice its handler has finished (a stop string), and :meth:`Run.close`, which stops the rest (a client
gone), frees its slots and records its metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import cast

from qkv.decoding.engine import Engine
from qkv.decoding.request import Request, TokenOutput
from qkv.server.errors import ServiceError
from qkv.server.jobs import CompletionJob
from qkv.server.limits import Gate
from qkv.server.metrics import Metrics
from qkv.server.model_thread import ModelThread

SCHEDULERS = ("batched", "sequential")


class Run:
    """One request's generation once it has a slot: its token outputs arrive on an asyncio queue."""

    def __init__(self, job: CompletionJob, metrics: Metrics, scheduler: str, loop: asyncio.AbstractEventLoop):
        self.job, self.metrics, self.scheduler, self.loop = job, metrics, scheduler, loop
        self.queue: asyncio.Queue[TokenOutput | None] = asyncio.Queue()
        self.rows_left = len(job.choices)
        self.stopped: set[int] = set()  # ids of the requests whose handler has finished them
        self.failed = self.closed = False
        self.in_engine = False  # a row of it has joined the batch (set by the model thread, under its lock)
        self.admitted = asyncio.Event()  # set on the event loop once ``in_engine``
        self.left_at_step: int | None = None  # the batched step count when its rows were dropped

    def put(self, item: TokenOutput | None) -> None:
        """From the model thread: hand ``item`` to the handler on the event loop."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop has closed (the server is stopping): nobody is listening
            pass

    def row_left(self) -> None:
        self.rows_left -= 1
        if self.rows_left == 0:
            self.put(None)

    async def outputs(self) -> AsyncIterator[TokenOutput]:
        while (item := await self.queue.get()) is not None:
            yield item

    def stop(self, request: Request) -> None:
        """The handler is done with this choice (a stop string): free its row at the next pass."""
        self.stopped.add(id(request))

    @property
    def completed(self) -> bool:
        return self.rows_left == 0 and not self.failed and not self.job.cancelled.is_set()

    def close(self) -> None:
        """Stop generating (if it has not ended), free the slots, count and log the request; once."""
        if self.closed:
            return
        self.closed = True
        completed = self.completed
        self.job.cancel()
        self.release()
        status = "error" if self.failed else "ok" if completed else "cancelled"
        self.metrics.request_done(self.job, status, self.scheduler)

    def release(self) -> None:
        """Give back what the request held (the sequential gate's slot)."""


# ------------------------------------------------------------------------------------- one at a time


def _run_of(request: Request) -> Run:
    """The run a row of the engine belongs to: the scheduler tags every request it adds with its run."""
    return cast(Run, request.tag)


class SequentialRun(Run):
    def __init__(self, job: CompletionJob, metrics: Metrics, loop, gate: Gate, scheduler: SequentialScheduler):
        super().__init__(job, metrics, "sequential", loop)
        self.gate, self.owner = gate, scheduler

    async def outputs(self) -> AsyncIterator[TokenOutput]:
        """Each choice through an engine of its own, one step per model-thread job."""
        for choice in self.job.choices:
            request = choice.request
            engine = await self.owner.worker.run(self.owner.engine_for, request)
            try:
                outputs = await self.owner.worker.run(engine.add, [request])
                while True:
                    for output in outputs:
                        self.failed |= output.error is not None
                        yield output
                    if not engine.running or self.job.cancelled.is_set() or id(request) in self.stopped:
                        break
                    outputs = await self.owner.worker.run(engine.step)
            finally:
                engine.close()
            if self.job.cancelled.is_set():
                return
        self.rows_left = 0

    def release(self) -> None:
        self.gate.leave()


class SequentialScheduler:
    """Each choice alone (an engine of one slot) on the model thread, at most ``gate.slots`` requests at once:
    their tokens interleave when they stream."""

    name = "sequential"

    def __init__(self, model, gate: Gate, metrics: Metrics, worker: ModelThread, step: str) -> None:
        self.model, self.gate, self.metrics, self.worker, self.step = model, gate, metrics, worker, step

    def engine_for(self, request: Request) -> Engine:
        context = self.model.config.context_length
        kept = min(len(request.prompt), context)
        length = max(1, min(context, kept + request.params.max_new_tokens - 1))
        return Engine(self.model, 1, length, step=self.step)

    async def start(self, job: CompletionJob) -> Run:
        await self.gate.enter()
        job.started = time.perf_counter()
        return SequentialRun(job, self.metrics, asyncio.get_running_loop(), self.gate, self)

    def running(self) -> int:
        return self.gate.active

    def waiting(self) -> int:
        return self.gate.waiting


# ------------------------------------------------------------------------------------------ batched


class BatchScheduler:
    """The loop over one :class:`~qkv.decoding.engine.Engine` of ``slots`` rows, run pass by pass by the model
    thread (:mod:`qkv.server.model_thread`) between its other jobs: admit, drop, step, route."""

    name = "batched"

    def __init__(self, model, slots: int, max_len: int, timeout: float, metrics: Metrics, worker: ModelThread,
                 step: str = "auto") -> None:  # fmt: skip
        self.metrics, self.worker, self.timeout = metrics, worker, timeout
        self.engine = Engine(model, slots, max_len, step=step)
        self.waiting_rows: deque[tuple[Run, Request]] = deque()
        self.steps = 0  # batched forwards so far
        self.passes = 0  # times the loop has admitted what it could
        self._cond = worker.cond  # the model thread's lock guards the waiting rows too
        worker.attach(self.has_work, self.run_once)

    async def start(self, job: CompletionJob) -> Run:
        """Queue the request's rows; return once its first row is in the engine, or 503 after the timeout."""
        run = Run(job, self.metrics, "batched", asyncio.get_running_loop())
        rows = []
        for choice in job.choices:
            choice.request.tag = run  # the engine hands it back with every output: the route to this request
            rows.append((run, choice.request))
        with self._cond:
            self.waiting_rows.extend(rows)
            seen = self.passes  # the loop must look at the queue at least once after this
            self.worker.wake()
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                await asyncio.wait_for(run.admitted.wait(), max(deadline - time.monotonic(), 0.01))
            except TimeoutError:
                pass
            with self._cond:
                if run.in_engine:
                    return run
                if time.monotonic() >= deadline and self.passes > seen:
                    for row in rows:
                        if row in self.waiting_rows:
                            self.waiting_rows.remove(row)
                    raise self._busy()

    def _busy(self) -> ServiceError:
        return ServiceError(
            503,
            f"the server is busy: {len(self.engine.running)} sequences in the batch (at most "
            f"{self.engine.slots}, --max-batch/--kv-memory/--kv-tokens) and none freed a row within "
            f"{self.timeout:g} s; try again shortly",
            kind="server_busy",
            code="server_busy",
            headers={"Retry-After": "1"},
        )

    def has_work(self) -> bool:
        """Rows waiting or running (asked by the model thread, with its lock held)."""
        return bool(self.waiting_rows or self.engine.running)

    def run_once(self) -> None:
        """One pass (from the model thread): admit what fits, drop who left, step, route the outputs."""
        engine = self.engine
        with self._cond:
            admitted: list[Request] = []
            while self.waiting_rows and len(admitted) < engine.free:
                run, request = self.waiting_rows.popleft()
                if run.job.cancelled.is_set():  # its client left while it waited
                    run.row_left()
                    continue
                if not run.in_engine:
                    run.in_engine = True
                    run.job.started = time.perf_counter()
                    run.loop.call_soon_threadsafe(run.admitted.set)
                admitted.append(request)
            self.passes += 1
        self._route(engine.add(admitted))  # their prompts in one forward
        gone = [r for r in engine.requests if _run_of(r).job.cancelled.is_set() or id(r) in _run_of(r).stopped]
        engine.abort(gone)
        for request in gone:
            _run_of(request).left_at_step = self.steps  # when its rows left (the tests read it)
            _run_of(request).row_left()
        self._route(engine.step())
        self.steps += 1

    def _route(self, outputs: list[TokenOutput]) -> None:
        for output in outputs:
            run = _run_of(output.request)
            if run.job.cancelled.is_set() or id(output.request) in run.stopped:
                if output.finish_reason is not None or output.error is not None:
                    run.row_left()
                continue
            run.put(output)
            if output.error is not None:
                run.failed = True
            if output.finish_reason is not None or output.error is not None:
                run.row_left()

    def running(self) -> int:
        return len({id(r.tag) for r in list(self.engine.requests)})

    def waiting(self) -> int:
        with self._cond:
            return len({id(run) for run, _ in self.waiting_rows if not run.in_engine})
