"""How completions share the model: one decoding loop for all of them (batched), or one at a time (sequential).

``--scheduler batched`` (the default) is continuous batching (:mod:`qkv.decoding.batcher`; Orca's
iteration-level scheduling, as vLLM and TGI serve): the model thread runs the decoding loop; every choice of every
request is a row of its batch; at each step the rows of clients that went away leave, waiting rows join as
cache rows free up (their prompt prefilled at once), and one batched forward makes the next token of every
row. The tokens go to each request's own queue, read by its handler on the event loop, so a stream sends a
token's text as soon as the step that made it ends. The pool of cache rows is the bound: a request that gets
no row within ``--queue-timeout`` seconds is refused with 503, as the sequential gate refuses it.

``--scheduler sequential`` is the path before it: each request generates alone (:func:`qkv.decoding.stream`,
its own KV cache), on the model thread, at most ``--max-concurrent`` at once (:class:`Gate`).
Both give the same tokens for the same request; the bench (bench/serve_load.py) runs the two side by side.

Either way :meth:`Scheduler.start` returns a :class:`Run`: the request's pieces of text as an async
iterator, and :meth:`Run.close`, which stops it (a client gone), frees its slot and records its metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator

from qkv.decoding.batcher import Batcher, Sequence
from qkv.server.completion import Choice, CompletionJob, Piece
from qkv.server.errors import ServiceError
from qkv.server.metrics import Metrics
from qkv.server.model_thread import ModelThread

SCHEDULERS = ("batched", "sequential")


class Run:
    """One request's generation once it has a slot: :meth:`pieces`, :meth:`collect`, :meth:`close`."""

    def __init__(self, job: CompletionJob, metrics: Metrics, scheduler: str) -> None:
        self.job, self.metrics, self.scheduler = job, metrics, scheduler
        self.completed = self.failed = self.closed = False

    def pieces(self) -> AsyncIterator[Piece]:  # pragma: no cover - interface
        raise NotImplementedError

    async def collect(self) -> list[dict]:
        """Every choice to its end, in OpenAI's shape (a request that does not stream)."""
        got = []
        pieces = self.pieces()
        try:
            async for piece in pieces:
                got.append(piece)
        finally:
            await pieces.aclose()
        return self.job.assemble(got)

    def close(self) -> None:
        """Stop generating (if it has not ended), free the slot, count and log the request; once."""
        if self.closed:
            return
        self.closed = True
        self.job.cancel()
        self.release()
        status = "error" if self.failed else "ok" if self.completed else "cancelled"
        self.metrics.request_done(self.job, status, self.scheduler)

    def release(self) -> None:
        """Give back what the request held (the sequential gate's slot)."""


# ------------------------------------------------------------------------------------- one at a time


class SequentialRun(Run):
    def __init__(self, job: CompletionJob, metrics: Metrics, gate, worker: ModelThread) -> None:
        super().__init__(job, metrics, "sequential")
        self.gate, self.worker = gate, worker

    async def pieces(self) -> AsyncIterator[Piece]:
        pieces = self.job.pieces()
        try:
            while True:
                piece = await self.worker.run(next, pieces, None)
                if piece is None:
                    break
                yield piece
            self.completed = True
        except Exception:
            self.failed = True
            raise
        finally:
            try:
                pieces.close()  # leave the model's generation loop now rather than when garbage-collected
            except ValueError:  # "generator already executing": a worker is still in it; job.cancel() stops it
                pass

    async def collect(self) -> list[dict]:
        try:  # one job for the whole generation: no hop per piece
            choices = await self.worker.run(self.job.run)
        except Exception:
            self.failed = True
            raise
        self.completed = not self.job.cancelled.is_set()
        return choices

    def release(self) -> None:
        self.gate.leave()


class SequentialScheduler:
    """Each request alone (its own KV cache) on the model thread, at most ``gate.slots`` at once: their
    tokens interleave when they stream."""

    name = "sequential"

    def __init__(self, gate, metrics: Metrics, worker: ModelThread) -> None:
        self.gate, self.metrics, self.worker = gate, metrics, worker

    async def start(self, job: CompletionJob) -> Run:
        await self.gate.enter()
        job.started = time.perf_counter()
        return SequentialRun(job, self.metrics, self.gate, self.worker)

    def running(self) -> int:
        return self.gate.active

    def waiting(self) -> int:
        return self.gate.waiting


# ------------------------------------------------------------------------------------------ batched


class BatchedRun(Run):
    """A request in the batch: its rows' pieces arrive on an asyncio queue, put there by the decoding thread."""

    def __init__(self, job: CompletionJob, metrics: Metrics, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(job, metrics, "batched")
        self.loop = loop
        self.queue: asyncio.Queue[Piece | Exception | None] = asyncio.Queue()
        self.started = False  # a row of it got a cache row (set by the decoding thread, under its lock)
        self.admitted = asyncio.Event()  # set on the event loop once ``started``
        self.rows_left = len(job.choices)

    def put(self, item: Piece | Exception | None) -> None:
        """From the decoding thread: hand ``item`` to the handler on the event loop."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop has closed (the server is stopping): nobody is listening
            pass

    def row_left(self) -> None:
        self.rows_left -= 1
        if self.rows_left == 0:
            self.put(None)

    async def pieces(self) -> AsyncIterator[Piece]:
        while True:
            item = await self.queue.get()
            if item is None:
                self.completed = not self.failed and not self.job.cancelled.is_set()
                return
            if isinstance(item, Exception):
                self.failed = True
                raise item
            yield item


class ChoiceRow(Sequence):
    """One choice as a row of the batch: its tokens go through :class:`~qkv.server.completion.Choice`."""

    def __init__(self, run: BatchedRun, choice: Choice) -> None:
        request = choice.job.request
        super().__init__(
            choice.prompt.ids,
            max_new_tokens=request.max_tokens,
            temperature=request.temperature,
            top_k=request.top_k or None,
            top_p=request.top_p,
            eos_id=choice.eos,
            generator=choice.generator,
        )
        self.run, self.choice = run, choice
        self.left_at_step: int | None = None  # the scheduler's step count when the row left (tests)

    def emit(self, token: int, logits) -> bool:
        for piece in self.choice.accept(token, logits):
            self.run.put(piece)
        return self.choice.finish_reason is None

    def finish(self) -> None:
        if not self.cancelled():
            for piece in self.choice.closing():
                self.run.put(piece)
        self.run.row_left()

    def fail(self, error: Exception) -> None:
        self.run.job.cancel()  # the request's other rows leave too
        self.run.put(error)
        self.run.row_left()

    def cancelled(self) -> bool:
        return self.run.job.cancelled.is_set()


class BatchScheduler:
    """The decoding loop over a :class:`~qkv.decoding.batcher.Batcher` of ``slots`` rows, run step by step
    by the model thread (:mod:`qkv.server.model_thread`) between its other jobs."""

    name = "batched"

    def __init__(self, service, slots: int, max_len: int, metrics: Metrics, worker: ModelThread) -> None:
        self.service, self.metrics, self.worker = service, metrics, worker
        self.timeout = service.limits.queue_timeout
        self.batcher = Batcher(service.model, slots, max_len)
        self.waiting_rows: deque[ChoiceRow] = deque()
        self.steps = 0  # batched forwards so far
        self.passes = 0  # times the loop has admitted what it could
        self._cond = worker.cond  # the model thread's lock guards the waiting rows too
        worker.attach(self.has_work, self.run_once)

    async def start(self, job: CompletionJob) -> Run:
        """Queue the request's rows; return once its first row is in the batch, or 503 after the timeout."""
        run = BatchedRun(job, self.metrics, asyncio.get_running_loop())
        rows = [ChoiceRow(run, choice) for choice in job.choices]
        with self._cond:
            self.waiting_rows.extend(rows)
            self.worker.wake()
        with self._cond:
            seen = self.passes  # the loop must look at the queue at least once after this
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                await asyncio.wait_for(run.admitted.wait(), max(deadline - time.monotonic(), 0.01))
            except TimeoutError:
                pass
            with self._cond:
                if run.started:
                    return run
                if time.monotonic() >= deadline and self.passes > seen:
                    for row in rows:
                        if row in self.waiting_rows:
                            self.waiting_rows.remove(row)
                    raise self._busy()

    def _busy(self) -> ServiceError:
        return ServiceError(
            503,
            f"the server is busy: {len(self.batcher.running)} sequences in the batch (at most "
            f"{self.batcher.slots}, --max-batch/--kv-memory/--kv-tokens) and none freed a row within "
            f"{self.timeout:g} s; try again shortly",
            kind="server_busy",
            code="server_busy",
            headers={"Retry-After": "1"},
        )

    def has_work(self) -> bool:
        """Rows waiting or running (asked by the model thread, with its lock held)."""
        return bool(self.waiting_rows or self.batcher.running)

    def run_once(self) -> None:
        """Admit what fits, drop the cancelled, step (from the model thread)."""
        batcher = self.batcher
        with self._cond:
            admitted = []
            while self.waiting_rows and len(admitted) < batcher.free:
                row = self.waiting_rows.popleft()
                if row.cancelled():  # its client left while it waited
                    row.run.row_left()
                    continue
                if not row.run.started:
                    row.run.started = True
                    row.run.job.started = time.perf_counter()
                    row.run.loop.call_soon_threadsafe(row.run.admitted.set)
                admitted.append(row)
            self.passes += 1
        self._step(admitted)

    def _step(self, admitted: list[ChoiceRow]) -> None:
        batcher = self.batcher
        joining = []
        for row in admitted:
            try:
                for piece in row.choice.opening():
                    row.run.put(piece)
            except Exception as error:  # noqa: BLE001 - e.g. the echoed prompt's logprobs: this request only
                row.fail(error)
                continue
            joining.append(row)
        batcher.add_all(joining)  # their prompts in one forward
        for row in list(batcher.running):
            if row.cancelled():
                row.left_at_step = self.steps
        batcher.drop_cancelled()
        batcher.step()
        self.steps += 1

    def stop(self) -> None:
        self.worker.stop()

    def running(self) -> int:
        return len({row.run for row in list(self.batcher.running)})

    def waiting(self) -> int:
        with self._cond:
            return len({row.run for row in self.waiting_rows if not row.run.started})
