"""The HTTP API and the playground page, as one FastAPI app around a :class:`~qkv.server.service.Service`.

    POST /v1/completions    continue prompts (OpenAI's completions API: n, stop, echo, logprobs, seed, stream)
    POST /v1/translations   translate sentences (encoder-decoder models)
    POST /v1/next-token     the next-token distribution under a temperature, top-k and top-p (`qkv next`)
    POST /v1/attention      every layer's and head's attention weights for a text (`qkv attention`)
    POST /v1/walkthrough    a language model's whole forward pass on a text, step by step (the walk-through)
    POST /tokenize          token ids of a text;  POST /detokenize: the text of token ids
    GET  /v1/model          what the model is (family, role, size, vocabulary, endpoints it offers, limits)
    GET  /v1/models         the model in OpenAI's list shape (and GET /v1/models/{id})
    GET  /health            liveness, and how many generations are running
    GET  /metrics           Prometheus' text format: requests, tokens, latency histograms, KV pool use
    GET  /                  the playground (static HTML, JS and CSS from qkv/server/static; no build, no CDN)

Before any of it, :class:`~qkv.server.guard.RequestGuard` refuses foreign Host headers, non-JSON bodies and
bodies over the size limit. Model work runs on one model thread (:mod:`qkv.server.model_thread`), tokenizing in
worker threads, so the event loop keeps serving while a model computes, and a stream sends each token's text
as soon as it is made. A client that disconnects stops its generation, streamed or not, and frees its slot.
Every error is a JSON body in OpenAI's shape (:mod:`qkv.server.errors`). Which endpoints a model offers is its
family's answer (:data:`qkv.server.service.NEEDS`); the others are 404 with the family's one line.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from qkv.errors import QkvError
from qkv.model_dir import ModelBundle
from qkv.server.completion import CompletionJob, check_request, choice_dict
from qkv.server.errors import ServiceError, error_body
from qkv.server.guard import RequestGuard, allowed_hosts
from qkv.server.model_thread import ModelThread
from qkv.server.notes import NoteHeader
from qkv.server.scheduler import Run
from qkv.server.schemas import (
    AttentionRequest,
    AttentionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelInfo,
    NextTokenRequest,
    NextTokenResponse,
    TokenizeRequest,
    TokenizeResponse,
    TranslationRequest,
    TranslationResponse,
    WalkthroughRequest,
)
from qkv.server.service import Gate, Limits, Service

STATIC = Path(__file__).parent / "static"


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One readable sentence from pydantic's error list ("temperature: Input should be ... (got -1)"), and
    the first field at fault."""
    parts, params = [], []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            parts.append('the body is not valid JSON: send a JSON object such as {"prompt": "Hello"}')
            continue
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        field = ".".join(loc) or "body"
        params.append(loc[0] if loc else None)
        got = f" (got {err['input']!r})" if "input" in err and not isinstance(err["input"], dict | list) else ""
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{field}: {message}{got}")
    return "; ".join(parts) or "the request body is invalid", (params[0] if params else None)


def _unreadable_body(exc: StarletteHTTPException) -> str | None:
    """The sentence for a body FastAPI could not parse for a reason other than a JSON syntax error (bytes that
    are not UTF-8, arrays nested past the parser's depth): the same 422 as any invalid JSON. None otherwise."""
    cause = exc.__cause__
    if exc.status_code != 400 or not isinstance(cause, UnicodeDecodeError | RecursionError | ValueError):
        return None
    why = "it is not UTF-8" if isinstance(cause, UnicodeDecodeError) else "it is nested too deeply"
    if not isinstance(cause, UnicodeDecodeError | RecursionError):
        why = str(cause)[:200]
    return f'the body is not valid JSON ({why}): send a JSON object such as {{"prompt": "Hello"}}'


class _GatedStream(StreamingResponse):
    """A streaming response that runs ``on_close`` when it ends, however it ends (done, error, disconnect)."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None], **kwargs) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def _sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def _gated(gate: Gate, worker: ModelThread, work: Callable, *args):
    """Run ``work(*args)`` on the model thread once ``gate`` lets it in."""
    await gate.enter()
    try:
        return await worker.run(work, *args)
    finally:
        gate.leave()


async def _disconnected(request: Request) -> None:
    """Return when the client goes away (the body has been read: the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(
    bundle: ModelBundle,
    limits: Limits | None = None,
    *,
    name: str | None = None,
    hosts: Sequence[str] | None = None,
    scheduler: str = "batched",
    engine: str = "auto",
) -> FastAPI:
    """The server for one loaded model (see :func:`qkv.load`) under ``limits``.

    ``hosts`` are the Host header names it answers to (default: the localhost names; see
    :func:`~qkv.server.guard.allowed_hosts`, "*" for any). ``scheduler`` is how completions share the model
    ("batched": continuous batching, or "sequential"; :mod:`qkv.server.scheduler`), ``engine`` how the
    sequential scheduler's steps run (:mod:`qkv.decoding.engine`).
    """
    service = Service(bundle, limits, name=name, scheduler=scheduler, engine=engine)
    app = FastAPI(title=f"qkv: {service.name}", description="The Transformer, served.", version="0.1.0")
    app.state.service = service
    app.router.add_event_handler("shutdown", service.model_thread.stop)
    app.add_middleware(NoteHeader)
    app.add_middleware(
        RequestGuard, hosts=allowed_hosts() if hosts is None else hosts, max_bytes=service.limits.max_request_bytes
    )

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(QkvError)
    async def _qkv_error(request: Request, exc: QkvError) -> JSONResponse:
        return JSONResponse(error_body(str(exc)), status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return JSONResponse(error_body(message, param=param, code="invalid_value"), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        unreadable = _unreadable_body(exc)
        if unreadable is not None:  # FastAPI's bare 400 for what json.loads raises besides JSONDecodeError
            return JSONResponse(error_body(unreadable, code="invalid_value"), status_code=422)
        message = str(exc.detail)
        if exc.status_code == 404:
            message = f"there is no {request.url.path} here: this server supports {', '.join(service.endpoints)}"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        return JSONResponse(error_body(message), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _failure(request: Request, exc: Exception) -> JSONResponse:
        body = error_body(f"the server failed: {type(exc).__name__}: {exc}", "server_error")
        return JSONResponse(body, status_code=500)

    @app.get("/health")
    async def health() -> dict:
        scheduler = service.scheduler
        return {
            "status": "ok",
            "model": service.name,
            "kind": service.kind,
            "scheduler": None if scheduler is None else scheduler.name,
            "active_generations": service.generations.active if scheduler is None else scheduler.running(),
            "max_concurrent": service.limits.max_concurrent,
        }

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> PlainTextResponse:
        """Prometheus' text format (qkv.server.metrics)."""
        return PlainTextResponse(service.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/model", response_model=ModelInfo)
    async def model_info() -> ModelInfo:
        return service.info()

    created = int(time.time())

    def model_card() -> dict:
        return {"id": service.name, "object": "model", "created": created, "owned_by": "qkv"}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict:
        service.check_model(model_id)
        return model_card()

    @app.post("/v1/completions", response_model=CompletionResponse, response_model_exclude_none=False)
    async def completions(body: CompletionRequest, request: Request):
        service.require("/v1/completions")
        check_request(service, body)  # the limits, before anything waits or runs
        job: CompletionJob = await run_in_threadpool(service.completion, body)  # tokenizing: off the event loop
        head = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time())}
        head["model"] = service.name
        job.id = head["id"]
        run = await service.scheduler.start(job)  # a slot (a row of the batch, or the gate), or 503
        if body.stream:
            return _GatedStream(
                _events(run, head),
                on_close=run.close,
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        work = asyncio.ensure_future(run.collect())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():  # the client left: stop at the next token; the slot frees when it stops
                job.cancel()
            gone.cancel()
            choices = await work
        finally:
            run.close()
        return {**head, "choices": choices, "usage": job.usage()}

    @app.post("/v1/translations", response_model=TranslationResponse)
    async def translations(body: TranslationRequest) -> TranslationResponse:
        service.require("/v1/translations")
        started, status, batches = time.perf_counter(), "error", service.translations
        sentences = 1 if isinstance(body.text, str) else len(body.text)
        try:
            texts, source_tokens = await run_in_threadpool(service.check_translation, body)  # refused before waiting
            if batches is None:  # --scheduler sequential: this request alone
                work = (service.generations, service.model_thread, service.translate_texts, texts, body.beam)
                outputs = await _gated(*work)
            else:
                outputs = await batches.translate(texts, body.beam)
            response = await run_in_threadpool(service.translation_response, outputs, source_tokens)
            status = "ok"
            return response
        except asyncio.CancelledError:
            status = "cancelled"
            raise
        finally:
            scheduler = "sequential" if batches is None else "batched"
            service.metrics.translation_done(status, sentences, body.beam, scheduler, time.perf_counter() - started)

    @app.post("/v1/next-token", response_model=NextTokenResponse)
    async def next_token(body: NextTokenRequest) -> NextTokenResponse:
        service.require("/v1/next-token")
        return await _gated(service.analyses, service.model_thread, service.next_token, body)

    @app.post("/v1/attention", response_model=AttentionResponse)
    async def attention(body: AttentionRequest) -> AttentionResponse:
        service.require("/v1/attention")
        return await _gated(service.analyses, service.model_thread, service.attention, body)

    @app.post("/v1/walkthrough")
    async def walkthrough(body: WalkthroughRequest) -> dict:
        service.require("/v1/walkthrough")
        return await _gated(service.analyses, service.model_thread, service.walkthrough, body)

    @app.post("/tokenize", response_model=TokenizeResponse, response_model_exclude_none=True)
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        return await run_in_threadpool(service.tokenize, body)

    @app.post("/detokenize", response_model=DetokenizeResponse)
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        return await run_in_threadpool(service.detokenize, body)

    @app.get("/", include_in_schema=False)
    async def playground() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


async def _events(run: Run, head: dict) -> AsyncIterator[str]:
    """Server-sent events in OpenAI's shape: one chunk per piece of text (with its tokens' logprobs), each
    choice's last chunk with its finish_reason, the usage in the chunk that ends the last choice to finish,
    then ``data: [DONE]``. With n > 1 the choices' chunks interleave (each carries its index), as OpenAI's do."""
    job = run.job
    finished: set[int] = set()
    pieces = run.pieces()
    try:
        async for piece in pieces:
            chunk = {**head, "choices": [choice_dict(piece.index, piece.text, piece.entries, job.request,
                                                     piece.finish_reason)]}  # fmt: skip
            if piece.finish_reason is not None:
                finished.add(piece.index)
                if len(finished) == len(job.choices):
                    chunk["usage"] = job.usage()
            yield _sse(chunk)
    except Exception as error:  # noqa: BLE001 - after the 200 header, errors travel as an event
        run.failed = True
        yield _sse(error_body(f"generation failed: {error}", "server_error"))
    finally:
        await pieces.aclose()
    yield _sse("[DONE]")
