"""What the routes share (qkv.server.routes.common): server-sent events, a stream that runs its closing however it
ends, and work behind a gate on the model thread."""

from __future__ import annotations

import asyncio
import json

import httpx
from fastapi import FastAPI

from qkv.server.background import BackgroundServer
from qkv.server.limits import Gate
from qkv.server.model_thread import ModelThread
from qkv.server.routes.common import SSE_HEADERS, GatedStream, gated, sse


def test_server_sent_events_are_data_lines_with_a_blank_line() -> None:
    assert sse({"a": "é"}) == 'data: {"a": "é"}\n\n'
    assert sse("[DONE]") == "data: [DONE]\n\n"
    assert json.loads(sse({"x": [1, 2]})[6:]) == {"x": [1, 2]}


def test_a_gated_stream_closes_when_done_and_when_the_client_leaves() -> None:
    closed: list[str] = []
    app = FastAPI()

    async def events(n: int):
        for i in range(n):
            yield sse({"i": i})
            await asyncio.sleep(0.01)

    @app.get("/events/{n}")
    async def stream(n: int):
        return GatedStream(events(n), on_close=lambda: closed.append(str(n)), media_type="text/event-stream",
                           headers=SSE_HEADERS)  # fmt: skip

    with BackgroundServer(app) as server:
        assert httpx.get(server.url + "/events/3").text.count("data: ") == 3
        with httpx.stream("GET", server.url + "/events/1000") as response:
            next(response.iter_lines())  # one event, then the client leaves
        for _ in range(200):
            if len(closed) == 2:
                break
            asyncio.run(asyncio.sleep(0.01))
    assert closed == ["3", "1000"]


def test_gated_work_runs_on_the_model_thread() -> None:
    import threading

    worker = ModelThread()
    gate = Gate(1, 5.0, "jobs")
    try:
        name = asyncio.run(gated(gate, worker, lambda: threading.current_thread().name))
    finally:
        worker.stop()
    assert name == "qkv-model" and gate.active == 0
