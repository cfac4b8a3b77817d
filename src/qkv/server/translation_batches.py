"""How ``/v1/translations`` requests share the model: translated together (batched), or one at a time.

A translation is one call of :meth:`qkv.decoding.translator.Translator.translate_n_best`: the sources are
encoded once, then beam search decodes ``beam`` rows per sentence, step by step, until every sentence has
ended. That call already takes a list of sentences, so the sentences of several requests can be one batch:
with B sentences of beam k, every step is one forward of B k rows instead of B forwards of k rows, and on a
CPU a forward of a few rows costs little more than one of a single row (it is bound by reading the
weights). Beam search is not iteration-scheduled like completions (:mod:`qkv.server.scheduler`): a batch of
sentences runs to its end, and the requests that arrived meanwhile form the next batch (dynamic batching,
as Triton's and TF Serving's batchers do). A translation is short and ends at a known bound (``max_len_a``
times the source length plus ``max_len_b``), so a request waits at most one batch before it starts.

``--scheduler batched`` (the default): one asyncio task takes the waiting requests in arrival order, all of
the first one's beam width, up to ``--max-batch`` decoder rows (sentences times beam; the first request
always goes, whatever its size), translates their sentences in one call in a worker thread, and hands each
request its own translations. A batch that raises is retried one request at a time, so a bad request fails
alone. A request that has not started within ``--queue-timeout`` seconds gets 503, as everywhere else. The
batches run on the server's model thread (:mod:`qkv.server.model_thread`).

``--scheduler sequential``: each request translates alone, at most ``--max-concurrent`` at once (the
generations :class:`~qkv.server.service.Gate`). bench/serve_translations.py runs the two side by side.

Each sentence of a batch is encoded with a padding mask and decoded in its own beams, so a request gets the
translations it would get alone; only the rounding of sums over a padded batch may differ (the product of
a few rows and of one row are blocked differently), which can change a translation at a near tie.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from starlette.concurrency import run_in_threadpool

from qkv.server.errors import ServiceError
from qkv.server.metrics import LOG


@dataclass
class Waiting:
    """One request in the queue: its sentences, beam width, and the future its handler awaits."""

    texts: list[str]
    beam: int
    result: asyncio.Future
    started: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: float = field(default_factory=time.perf_counter)
    abandoned: bool = False  # its handler gave up (timeout or the client left) before it started

    @property
    def rows(self) -> int:
        return len(self.texts) * self.beam


class TranslationBatches:
    """The queue of translation requests and the task that translates them in batches."""

    name = "batched"

    def __init__(
        self,
        translate: Callable[[list[str], int], list[str]],
        max_rows: int,
        timeout: float,
        *,
        run: Callable[..., Awaitable] = run_in_threadpool,
    ) -> None:
        self.translate_many = translate  # (sentences, beam) -> one translation per sentence
        self.run = run  # how it runs off the event loop: the server's model thread
        self.max_rows, self.timeout = max_rows, timeout
        self.waiting: deque[Waiting] = deque()
        self.batches = 0  # batches translated so far (tests, the log)
        self.running = 0  # requests in the batch being translated
        self._task: asyncio.Task | None = None

    async def translate(self, texts: list[str], beam: int) -> list[str]:
        """The translation of each of ``texts``, batched with whatever else waits; 503 if it cannot start in time."""
        entry = Waiting(list(texts), beam, asyncio.get_running_loop().create_future())
        self.waiting.append(entry)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._drain())
        try:
            try:
                await asyncio.wait_for(entry.started.wait(), self.timeout)
            except TimeoutError:
                if not entry.started.is_set():
                    entry.abandoned = True
                    raise self._busy() from None
            return await asyncio.shield(entry.result)
        except asyncio.CancelledError:  # the client went away: leave the queue if not started yet
            entry.abandoned = True
            raise

    def _busy(self) -> ServiceError:
        return ServiceError(
            503,
            f"the server is busy: {self.running} translation requests in the running batch and "
            f"{len(self.waiting)} waiting, none started within {self.timeout:g} s; try again shortly",
            kind="server_busy",
            code="server_busy",
            headers={"Retry-After": "1"},
        )

    def next_batch(self) -> list[Waiting]:
        """The waiting requests that go together: the first one, then the later ones of its beam width, in
        arrival order, while the rows fit under ``max_rows``. The abandoned ones leave the queue."""
        batch: list[Waiting] = []
        rows = 0
        for entry in list(self.waiting):
            if entry.abandoned:
                self.waiting.remove(entry)
                continue
            if batch and (entry.beam != batch[0].beam or rows + entry.rows > self.max_rows):
                continue
            batch.append(entry)
            rows += entry.rows
            self.waiting.remove(entry)
        return batch

    async def _drain(self) -> None:
        while self.waiting:
            batch = self.next_batch()
            if not batch:
                return
            for entry in batch:
                entry.started.set()
            self.running = len(batch)
            try:
                await self._run(batch)
            finally:
                self.running = 0
                self.batches += 1

    async def _run(self, batch: list[Waiting]) -> None:
        texts = [text for entry in batch for text in entry.texts]
        started = time.perf_counter()
        try:
            outputs = await self.run(self.translate_many, texts, batch[0].beam)
        except Exception as error:  # noqa: BLE001 - retried alone below, so only the failing request fails
            if len(batch) == 1:
                _settle(batch[0], error=error)
                return
            for entry in batch:
                await self._run([entry])
            return
        LOG.info(
            "translations batch=%d requests=%d sentences=%d beam=%d time=%.1fms",
            self.batches, len(batch), len(texts), batch[0].beam, 1000 * (time.perf_counter() - started),
        )  # fmt: skip
        at = 0
        for entry in batch:
            _settle(entry, outputs[at : at + len(entry.texts)])
            at += len(entry.texts)


def _settle(entry: Waiting, outputs: list[str] | None = None, error: Exception | None = None) -> None:
    if entry.result.done() or (entry.abandoned and error is not None):  # nobody would read the error
        return
    if error is not None:
        entry.result.set_exception(error)
    else:
        entry.result.set_result(outputs)
