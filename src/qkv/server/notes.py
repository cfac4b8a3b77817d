"""Notes for the client about its request, sent with the answer in an ``X-Qkv-Note`` header.

What the CLI prints as a ``note:`` line (e.g. :func:`qkv.tokenizers.unknown.unknown_note`: how many tokens of
the text became <unk>) the server attaches to the response, so the numbers it returns are never read
without the caveat, and logs it. A request's notes live in a context variable that :class:`NoteHeader`
sets for the request; code deeper down calls :func:`add_note`.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-qkv-note"
_notes: ContextVar[list[str] | None] = ContextVar("qkv_request_notes", default=None)
_log = logging.getLogger("qkv.server")


def add_note(note: str | None) -> None:
    """Attach ``note`` (if any) to the current request's response, and log it."""
    if not note:
        return
    _log.warning(note)
    notes = _notes.get()
    if notes is not None and note not in notes:
        notes.append(note)


class NoteHeader:
    """ASGI middleware: collects a request's notes and sends them as ``X-Qkv-Note`` (joined by ' | ')."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        notes: list[str] = []
        token = _notes.set(notes)

        async def send_with_notes(message: Message) -> None:
            if message["type"] == "http.response.start" and notes:
                value = " | ".join(notes).encode("latin-1", "replace")
                message = {**message, "headers": [*message.get("headers", []), (HEADER.encode(), value)]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_notes)
        finally:
            _notes.reset(token)
