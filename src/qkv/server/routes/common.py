"""What every route module shares: the service of the app, running work on the model thread behind a gate, and
server-sent events that end however the client ends them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import StreamingResponse

from qkv.server.limits import Gate
from qkv.server.model_thread import ModelThread
from qkv.server.service import Service


def service_of(request: Request) -> Service:
    """The app's service (a FastAPI dependency)."""
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(service_of)]
"""A handler's ``service: ServiceDep`` argument: the app's service."""


async def gated(gate: Gate, worker: ModelThread, work: Callable, *args):
    """Run ``work(*args)`` on the model thread once ``gate`` lets it in."""
    await gate.enter()
    try:
        return await worker.run(work, *args)
    finally:
        gate.leave()


async def disconnected(request: Request) -> None:
    """Return when the client goes away (the body has been read: the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class GatedStream(StreamingResponse):
    """A streaming response that runs ``on_close`` when it ends, however it ends (done, error, disconnect)."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None], **kwargs) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
