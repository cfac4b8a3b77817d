"""POST /v1/translations: translate sentences with an encoder-decoder, batched across requests or one at a time
(:mod:`qkv.server.translation_batches`). A request is checked before it waits; one whose client leaves stops
waiting and counts as cancelled."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from qkv.server.routes.common import ServiceDep, disconnected, gated
from qkv.server.schemas import TranslationRequest, TranslationResponse

router = APIRouter()


@router.post("/v1/translations", response_model=TranslationResponse)
async def translations(body: TranslationRequest, request: Request,
                       service: ServiceDep) -> TranslationResponse | Response:  # fmt: skip
    service.require("/v1/translations")
    started, status, batches = time.perf_counter(), "error", service.translations
    sentences = 1 if isinstance(body.text, str) else len(body.text)
    try:
        texts, source_tokens = await run_in_threadpool(service.check_translation, body)  # refused before waiting
        if batches is None:  # --scheduler sequential: this request alone
            work = gated(service.generations, service.model_thread, service.translate_texts, texts, body.beam)
        else:
            work = batches.translate(texts, body.beam)
        outputs = await _unless_gone(work, request)
        if outputs is None:
            status = "cancelled"
            return Response(status_code=499)  # nginx's "client closed request": nobody is listening
        response = await run_in_threadpool(service.translation_response, outputs, source_tokens)
        status = "ok"
        return response
    except asyncio.CancelledError:
        status = "cancelled"
        raise
    finally:
        scheduler = "sequential" if batches is None else "batched"
        service.metrics.translation_done(status, sentences, body.beam, scheduler, time.perf_counter() - started)


async def _unless_gone(work, request: Request):
    """``await work``, or None (the work cancelled) when the client goes away first."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            return None
        return task.result()
    finally:
        gone.cancel()
