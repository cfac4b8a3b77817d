"""What reaches the API at all: requests addressed to this server, with a JSON body of bounded size.

Three checks run before FastAPI parses anything (:class:`RequestGuard`, a plain ASGI middleware, so streams
pass through untouched):

- **Host.** Only the names this server answers to: the localhost names, the address it is bound to, and
  any given with ``--allow-host``. A web page whose domain is made to resolve to 127.0.0.1 (DNS rebinding)
  then cannot drive the API from the user's own browser: its requests carry its own name. 400 otherwise.
- **Content type.** A POST body must be JSON (``Content-Type: application/json``). A cross-site HTML form
  (text/plain or form-encoded, which browsers send without asking) cannot start a generation, and a
  client that forgot the header is told so. 415 otherwise.
- **Size.** A body larger than ``max_bytes`` is refused by its Content-Length before a byte of it is read,
  or as soon as the bytes read pass the limit (a chunked upload). 413. A 50 MB prompt never reaches the
  JSON parser or the tokenizer, so it cannot stall the event loop.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from qkv.server.errors import ServiceError

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("0.0.0.0", "::", "")


def allowed_hosts(bind: str = "127.0.0.1", extra: Sequence[str] = ()) -> list[str]:
    """The Host names a server bound to ``bind`` answers to: the localhost names; ``bind`` itself; for a
    wildcard bind (0.0.0.0, ::) this machine's names and addresses; and ``extra`` ("*" allows any)."""
    names = [*LOCAL_NAMES, bind]
    if bind in WILDCARDS:
        names += machine_names()
    names += list(extra)
    return list(dict.fromkeys(host_name(n) for n in names if n))


def machine_names() -> list[str]:
    """This machine's host name, fully qualified name and addresses (what a LAN client types)."""
    hostname = socket.gethostname()
    names = [hostname, socket.getfqdn()]
    try:
        names += [str(info[4][0]) for info in socket.getaddrinfo(hostname, None)]
    except OSError:
        pass
    return names


def host_name(header: str) -> str:
    """The name in a Host header, without the port and IPv6 brackets, lower case: "[::1]:8000" -> "::1"."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.index("]")] if "]" in header else header[1:]
    if header.count(":") == 1:
        return header.split(":")[0]
    return header


def is_json(content_type: str) -> bool:
    """application/json, with parameters (charset) or as a +json subtype."""
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class RequestGuard:
    """ASGI middleware: refuse foreign Host headers (400), non-JSON POST bodies (415), big bodies (413)."""

    def __init__(self, app: ASGIApp, *, hosts: Sequence[str], max_bytes: int, flag: str = "--max-request-bytes"):
        self.app, self.max_bytes, self.flag = app, max_bytes, flag
        self.hosts = {host_name(h) for h in hosts}
        self.any_host = "*" in self.hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            self._check_host(headers)
            if scope["method"] in ("POST", "PUT", "PATCH"):
                self._check_type(headers)
                self._check_length(headers)
                body = await self._read(receive)
                if body is None:  # the client left before sending its body
                    return
                receive = _replay(body, receive)
        except ServiceError as error:
            await error.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _check_host(self, headers: Headers) -> None:
        if self.any_host:
            return
        header = headers.get("host")
        if header is None:
            raise ServiceError(400, "the request has no Host header: send one (HTTP/1.1 requires it)", code="no_host")
        if host_name(header) not in self.hosts:
            shown = ", ".join(sorted(self.hosts)[:6])
            raise ServiceError(
                400,
                f"the Host header {header!r} is not a name this server answers to ({shown}): use one of those, "
                f"or start `qkv serve` with --allow-host {host_name(header)}",
                code="invalid_host",
            )

    def _check_type(self, headers: Headers) -> None:
        content_type = headers.get("content-type", "")
        if not is_json(content_type):
            got = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
            raise ServiceError(
                415,
                f"the body must be JSON, and this request has {got}: send it with Content-Type: application/json",
                code="unsupported_media_type",
            )

    def _check_length(self, headers: Headers) -> None:
        length = headers.get("content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_bytes:
            raise self._too_large(int(length))

    def _too_large(self, size: int | None = None) -> ServiceError:
        has = f"has {size:,} bytes, more than" if size is not None else "is larger than"
        return ServiceError(
            413,
            f"the request body {has} the {self.max_bytes:,} bytes this server accepts ({self.flag}): "
            "send a shorter prompt",
            code="request_too_large",
        )

    async def _read(self, receive: Receive) -> bytes | None:
        """The whole body, read here so that its size is known before anything parses it."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then passes on what comes next (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
