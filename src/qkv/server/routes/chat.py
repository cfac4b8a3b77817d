"""POST /v1/chat/completions: OpenAI's chat completions API on the model's chat template.

The conversation is rendered by the template (:func:`qkv.server.jobs.prepare_chat`, from the model's GGUF metadata,
its Hugging Face folder, or ``qkv serve --chat-template FILE``) and becomes a job like a completion's: the same
scheduler, engine and text layer, the answer ending at the template's end of turn (``finish_reason`` "stop"), a
stop string, or ``max_completion_tokens`` ("length"). Answers come as ``message`` objects, or streamed as
``chat.completion.chunk`` deltas (the role first, then the content, then the finish; with
``stream_options.include_usage`` a last chunk with the usage). ``logprobs``/``top_logprobs`` are OpenAI's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from qkv.decoding.text import Entry, Piece
from qkv.server.errors import error_body
from qkv.server.jobs import CompletionJob, prepare_chat
from qkv.server.pieces import choice_texts, pieces, to_the_end
from qkv.server.routes.common import SSE_HEADERS, GatedStream, ServiceDep, disconnected, sse
from qkv.server.scheduler import Run
from qkv.server.schemas import ChatCompletionRequest

router = APIRouter()


def _token(text: str, logprob: float | None) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def logprobs_content(entries: list[Entry], top: int) -> dict:
    """OpenAI's chat logprobs: per token its text, logprob, UTF-8 bytes and its ``top`` likeliest alternatives."""
    return {"content": [{**_token(e.token, e.logprob),
                         "top_logprobs": [_token(t, lp) for t, lp in list((e.top or {}).items())[:top]]}
                        for e in entries]}  # fmt: skip


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, service: ServiceDep):
    service.require("/v1/chat/completions")
    service.check_model(body.model)
    job = await run_in_threadpool(
        prepare_chat, body, service.bundle, service.chat_template, service.limits, service.device
    )
    texts = choice_texts(job, service.tokenizer, body.logprobs)
    job.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    head = {"id": job.id, "created": int(time.time()), "model": service.name}
    assert service.scheduler is not None  # a language model has one (service.require refused the rest)
    run = await service.scheduler.start(job)  # a slot (rows of the batch, or the gate), or 503
    made = pieces(run, texts, [], service.metrics)
    top = body.top_logprobs or 0
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return GatedStream(events(made, run, head, body.logprobs, top, usage), on_close=run.close,
                           media_type="text/event-stream", headers=SSE_HEADERS)  # fmt: skip
    choices = await to_the_end(collect(made, job, body.logprobs, top), run, disconnected(request))
    return {**head, "object": "chat.completion", "choices": choices, "usage": job.usage()}


async def collect(made: AsyncIterator[Piece], job: CompletionJob, logprobs: bool, top: int) -> list[dict]:
    """Every choice to its end, as OpenAI's ``message`` objects."""
    texts: dict[int, list[str]] = {c.index: [] for c in job.choices}
    entries: dict[int, list[Entry]] = {c.index: [] for c in job.choices}
    finish: dict[int, str | None] = {c.index: None for c in job.choices}
    async for piece in made:
        texts[piece.index].append(piece.text)
        entries[piece.index] += piece.entries
        finish[piece.index] = piece.finish_reason or finish[piece.index]
    return [{"index": i, "message": {"role": "assistant", "content": "".join(texts[i])},
             "logprobs": logprobs_content(entries[i], top) if logprobs else None, "finish_reason": finish[i]}
            for i in texts]  # fmt: skip


async def events(made: AsyncIterator[Piece], run: Run, head: dict, logprobs: bool, top: int,
                 usage: bool) -> AsyncIterator[str]:  # fmt: skip
    """``chat.completion.chunk`` events: each choice's role first, then its content deltas (with their logprobs),
    then an empty delta with its finish_reason; the usage chunk when asked; then ``data: [DONE]``."""
    head = {**head, "object": "chat.completion.chunk"}

    def chunk(index: int, delta: dict, entries: list[Entry] | None = None, finish: str | None = None) -> str:
        lp = logprobs_content(entries or [], top) if logprobs and entries else None
        return sse({**head, "choices": [{"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}]})

    try:
        for choice in run.job.choices:
            yield chunk(choice.index, {"role": "assistant", "content": ""})
        async for piece in made:
            if piece.text or piece.entries:
                yield chunk(piece.index, {"content": piece.text}, piece.entries)
            if piece.finish_reason is not None:
                yield chunk(piece.index, {}, finish=piece.finish_reason)
        if usage:
            yield sse({**head, "choices": [], "usage": run.job.usage()})
    except Exception as error:  # noqa: BLE001 - after the 200 header, errors travel as an event
        run.failed = True
        yield sse(error_body(f"generation failed: {error}", "server_error"))
    yield sse("[DONE]")
