"""BackgroundServer (qkv.server.background): an app served on a free port in a thread, stopped on exit."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from qkv.server.background import BackgroundServer


def test_it_serves_on_a_free_port_and_stops() -> None:
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict:
        return {"pong": True}

    with BackgroundServer(app) as server:
        assert server.url.startswith("http://127.0.0.1:")
        assert httpx.get(server.url + "/ping").json() == {"pong": True}
        url = server.url
    try:
        httpx.get(url + "/ping", timeout=1)
    except httpx.TransportError:
        return
    raise AssertionError("the server still answers after the block")
