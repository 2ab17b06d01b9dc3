"""What the plain ASGI middlewares of this package share: the ASGI types, a ``send`` that
notes how far the answer went, and a JSON answer of their own.

Why plain ASGI (no Starlette base class): streaming responses pass untouched and a
middleware costs a header look-up. Why one module: each middleware watched or answered
with the same few lines of its own.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

__all__ = ["Scope", "Message", "Receive", "Send", "ASGIApp", "WatchedSend", "send_json"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class WatchedSend:
    """``send`` for the app a middleware wraps: passes every message on, and notes whether
    the answer has started (its status and headers went out) and ended (its last body part
    went out). ``on_start`` may change the start message (its headers) before it goes."""

    def __init__(self, send: Send, on_start: Callable[[Message], None] | None = None) -> None:
        self._send = send
        self._on_start = on_start
        self.started = False
        self.ended = False

    async def __call__(self, message: Message) -> None:
        kind = message.get("type")
        if kind == "http.response.start":
            if self._on_start is not None:
                self._on_start(message)
            self.started = True
        elif kind == "http.response.body" and not message.get("more_body", False):
            self.ended = True
        await self._send(message)


async def send_json(send: Send, status: int, payload: dict[str, Any],
                    headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """Answer ``status`` with ``payload`` as JSON (and ``headers``), in one body part."""
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body, "more_body": False})
