"""The HTTP API and the playground page, as one FastAPI app around a :class:`~qkv.server.service.Service`.

    POST /v1/completions    continue prompts (OpenAI's completions API: n, stop, echo, logprobs, seed, stream)
    POST /v1/chat/completions  answer a conversation with the model's chat template (OpenAI's chat API)
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

from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from qkv.chat_templates import ChatTemplate
from qkv.errors import QkvError
from qkv.model_dir import ModelBundle
from qkv.server.errors import ServiceError, error_body
from qkv.server.guard import RequestGuard, allowed_hosts
from qkv.server.limits import Limits
from qkv.server.notes import NoteHeader
from qkv.server.routes import ROUTERS
from qkv.server.routes.meta import STATIC
from qkv.server.service import Service


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


def create_app(
    bundle: ModelBundle,
    limits: Limits | None = None,
    *,
    name: str | None = None,
    hosts: Sequence[str] | None = None,
    scheduler: str = "batched",
    step: str = "auto",
    chat_template: ChatTemplate | None = None,
) -> FastAPI:
    """The server for one loaded model (see :func:`qkv.load`) under ``limits``.

    ``hosts`` are the Host header names it answers to (default: the localhost names; see
    :func:`~qkv.server.guard.allowed_hosts`, "*" for any). ``scheduler`` is how completions share the model
    ("batched": continuous batching, or "sequential"; :mod:`qkv.server.scheduler`), ``step`` how the
    decoding engine's steps run (:mod:`qkv.decoding.fast_step`); ``chat_template`` replaces the model's own for
    /v1/chat/completions.
    """
    service = Service(bundle, limits, name=name, scheduler=scheduler, step=step, chat_template=chat_template)
    app = FastAPI(title=f"qkv: {service.name}", description="The Transformer, served.", version="0.1.0")
    app.state.service = service
    app.router.add_event_handler("shutdown", service.model_thread.stop)
    app.add_middleware(NoteHeader)
    app.add_middleware(
        RequestGuard, hosts=allowed_hosts() if hosts is None else hosts, max_bytes=service.limits.max_request_bytes
    )
    _add_error_handlers(app, service)
    for router in ROUTERS:
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def _add_error_handlers(app: FastAPI, service: Service) -> None:
    """Every failure as OpenAI's error body: the service's own errors, QkvError (400), a body that fails
    validation (422), FastAPI's 404 and 405 (naming what is served), and anything else (500)."""

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
