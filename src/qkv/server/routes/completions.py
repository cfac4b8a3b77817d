"""POST /v1/completions: OpenAI's completions API (n, stop, echo, logprobs, seed, usage, streaming).

The walk of one request, in one direction: the body is checked once and made into a job
(:func:`qkv.server.jobs.prepare_completion`: its prompts as ids, one SamplingParams, its choices); the scheduler
gives it a slot (:meth:`~qkv.server.scheduler.BatchScheduler.start`, or 503) and its rows run in the decoding
engine on the model thread; the engine's token outputs come back through the run's queue, and
:class:`qkv.server.output.ChoiceText` makes text of them here, on the event loop (stop strings, logprobs); the
pieces go out as server-sent events, or joined into one response. A client that disconnects stops its
generation, streamed or not, and frees its slots.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from qkv.decoding.text import ChoiceText, Entry, Piece
from qkv.server.errors import error_body
from qkv.server.jobs import CompletionJob, prepare_completion
from qkv.server.output import logprobs_dict, prompt_entries
from qkv.server.pieces import choice_texts, pieces, to_the_end
from qkv.server.routes.common import SSE_HEADERS, GatedStream, ServiceDep, disconnected, sse
from qkv.server.scheduler import Run
from qkv.server.schemas import CompletionRequest, CompletionResponse
from qkv.server.service import Service

router = APIRouter()


def choice_dict(index: int, text: str, entries: list[Entry], logprobs: bool, finish: str | None) -> dict:
    return {"text": text, "index": index, "logprobs": logprobs_dict(entries) if logprobs else None,
            "finish_reason": finish}  # fmt: skip


async def openings(job: CompletionJob, texts: dict[int, ChoiceText], service: Service, top: int | None) -> list[Piece]:
    """The echoed prompts (with their logprobs: a forward pass on the model thread, once per prompt)."""
    entries: dict[int, list[Entry]] = {}
    if top is not None:
        for prompt in job.prompts:
            if id(prompt) not in entries:
                work = (prompt_entries, service.model, service.tokenizer, prompt.ids, top)
                entries[id(prompt)] = await service.model_thread.run(*work)
    return [
        piece
        for c in job.choices
        for piece in texts[id(c.request)].opening(c.prompt.text, entries.get(id(c.prompt), []))
    ]


@router.post("/v1/completions", response_model=CompletionResponse, response_model_exclude_none=False)
async def completions(body: CompletionRequest, request: Request, service: ServiceDep):
    service.require("/v1/completions")
    service.check_model(body.model)
    job = await run_in_threadpool(prepare_completion, body, service.tokenizer, service.limits, service.device)
    texts = choice_texts(job, service.tokenizer, body.logprobs is not None)
    opened = await openings(job, texts, service, body.logprobs) if body.echo else []
    job.id = f"cmpl-{uuid.uuid4().hex[:24]}"
    head = {"id": job.id, "object": "text_completion", "created": int(time.time()), "model": service.name}
    assert service.scheduler is not None  # a language model has one (service.require refused the rest)
    run = await service.scheduler.start(job)  # a slot (rows of the batch, or the gate), or 503
    made = pieces(run, texts, opened, service.metrics)
    logprobs = body.logprobs is not None
    if body.stream:
        return GatedStream(events(made, run, head, logprobs), on_close=run.close, media_type="text/event-stream",
                           headers=SSE_HEADERS)  # fmt: skip
    choices = await to_the_end(collect(made, job, logprobs), run, disconnected(request))
    return {**head, "choices": choices, "usage": job.usage()}


async def collect(made: AsyncIterator[Piece], job: CompletionJob, logprobs: bool) -> list[dict]:
    """Every choice to its end, joined, in OpenAI's shape."""
    texts: dict[int, list[str]] = {c.index: [] for c in job.choices}
    entries: dict[int, list[Entry]] = {c.index: [] for c in job.choices}
    finish: dict[int, str | None] = {c.index: None for c in job.choices}
    async for piece in made:
        texts[piece.index].append(piece.text)
        entries[piece.index] += piece.entries
        finish[piece.index] = piece.finish_reason or finish[piece.index]
    return [choice_dict(i, "".join(texts[i]), entries[i], logprobs, finish[i]) for i in texts]


async def events(made: AsyncIterator[Piece], run: Run, head: dict, logprobs: bool) -> AsyncIterator[str]:
    """Server-sent events in OpenAI's shape: one chunk per piece of text (with its tokens' logprobs), each
    choice's last chunk with its finish_reason, the usage in the chunk that ends the last choice to finish,
    then ``data: [DONE]``. With n > 1 the choices' chunks interleave (each carries its index), as OpenAI's do."""
    job = run.job
    finished: set[int] = set()
    try:
        async for piece in made:
            chunk = {**head, "choices": [choice_dict(piece.index, piece.text, piece.entries, logprobs,
                                                     piece.finish_reason)]}  # fmt: skip
            if piece.finish_reason is not None:
                finished.add(piece.index)
                if len(finished) == len(job.choices):
                    chunk["usage"] = job.usage()
            yield sse(chunk)
    except Exception as error:  # noqa: BLE001 - after the 200 header, errors travel as an event
        run.failed = True
        yield sse(error_body(f"generation failed: {error}", "server_error"))
    yield sse("[DONE]")
