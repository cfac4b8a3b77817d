"""Run the server in a background thread of this process, on a free loopback port (tests, benchmarks, notebooks).

    with BackgroundServer(create_app(bundle)) as server:
        httpx.get(server.url + "/health").json()     # {"status": "ok", ...}

The socket is bound before uvicorn starts (port 0 lets the system pick a free port), so there is no race
between choosing a port and listening on it.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


class BackgroundServer:
    """uvicorn serving ``app`` in a daemon thread; ``url`` is where it listens once :meth:`start` returns."""

    def __init__(self, app, *, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        self.app, self.host, self.port, self.log_level = app, host, port, log_level
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level=self.log_level, timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self.server is not None and self.thread is not None:
            self.server.should_exit = True
            self.thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
