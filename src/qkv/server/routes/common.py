"""What every route module shares: the service of the app, and running work on the model thread behind a gate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request

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
