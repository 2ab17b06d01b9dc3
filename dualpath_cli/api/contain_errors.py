"""A request that fails inside the API answers 500 and leaves its connection open.

Why: Starlette's outermost error middleware answers an unhandled exception with 500 and then
re-raises it, so uvicorn closes the connection: the next request a keep-alive client sends
on it is reset (issue 34 item 3). This middleware sits inside that one, logs the bug once,
answers ``{"detail": "internal error: ..."}`` with 500 when no answer has started, and does
not re-raise, so one bad request costs only its own answer. A plain ASGI middleware, like
the others in this package.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["ContainErrors"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("dualpath.api")


def _detail(err: BaseException) -> bytes:
    text = " ".join(f"internal error: {type(err).__name__}: {err}".split())
    return json.dumps({"detail": text[:1000]}).encode()


class ContainErrors:
    """Wrap ``app``: an exception it raises becomes a 500 answer, never a dropped
    connection (unless half an answer was already sent)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = ended = False

        async def tracked(message: Message) -> None:
            nonlocal started, ended
            if message.get("type") == "http.response.start":
                started = True
            elif message.get("type") == "http.response.body" and not message.get(
                    "more_body", False):
                ended = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as err:  # the one place a bug becomes a 500
            log.exception("unhandled error in a request")
            if ended:  # the answer went out whole: the connection is fine
                return
            if started:  # half an answer is out: only closing the connection ends it
                raise
            body = _detail(err)
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body, "more_body": False})
