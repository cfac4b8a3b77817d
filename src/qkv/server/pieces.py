"""A job's text as its token outputs arrive: one :class:`~qkv.decoding.text.ChoiceText` per choice, the pieces of
every choice interleaved (each naming its index), a stop string freeing its row at once. Completions and chat
completions share it; only their JSON differs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from qkv.decoding.text import ChoiceText, Piece
from qkv.server.jobs import CompletionJob
from qkv.server.metrics import Metrics
from qkv.server.scheduler import Run
from qkv.tokenizers.base import Tokenizer

T = TypeVar("T")


def choice_texts(job: CompletionJob, tokenizer: Tokenizer, logprobs: bool) -> dict[int, ChoiceText]:
    """One text maker per choice, by the id of its engine request."""
    stops = job.params.stop
    return {id(c.request): ChoiceText(tokenizer, c.index, c.prompt.text, c.prompt.ids, stops, logprobs)
            for c in job.choices}  # fmt: skip


async def pieces(
    run: Run, texts: dict[int, ChoiceText], openings: list[Piece], metrics: Metrics
) -> AsyncIterator[Piece]:
    """The job's pieces of text as its token outputs arrive (choices interleaved, each piece naming its index)."""
    for piece in openings:
        yield piece
    job = run.job
    async for output in run.outputs():
        text = texts[id(output.request)]
        if text.finish_reason is not None:  # its handler already closed it (a stop string): a late token
            continue
        if output.error is not None:
            run.failed = True
            raise output.error
        if output.token is not None:
            job.token_made()
            metrics.token()
            for piece in text.accept(output):
                yield piece
        if text.finish_reason is not None or output.finish_reason is not None:
            if output.finish_reason is None:  # a stop string: the row may go on in the engine; free it
                run.stop(output.request)
            for piece in text.closing():
                yield piece


async def to_the_end(collected: Awaitable[T], run: Run, gone: Awaitable[None]) -> T:
    """What ``collected`` (a job's pieces joined) gives, even if the client goes away first (``gone`` returns):
    then the job stops at its next step and ``collected`` ends with what was made. The run closes either way."""
    work, left = asyncio.ensure_future(collected), asyncio.ensure_future(gone)
    try:
        await asyncio.wait({work, left}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():  # the client left: stop at the next step; the slots free when it stops
            run.job.cancel()
        left.cancel()
        return await work
    finally:
        run.close()
