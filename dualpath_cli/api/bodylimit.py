"""Request size limit: a body larger than the limit is refused with 413 before a handler reads it.

A plain ASGI middleware (api/asgi.py; no Starlette base class, so streaming responses pass
untouched):
a declared ``Content-Length`` over the limit is answered at once; a body sent without one
(chunked) is counted as it arrives and cut off at the limit. The limit is
``dualpath_cli.limits`` ``request_bytes`` (16 MiB: a 65,536-token prompt as JSON token ids is
under 1 MiB), raised with ``DUALPATH_LIMIT_REQUEST_BYTES``.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException

from dualpath_cli.api.asgi import ASGIApp, Message, Receive, Scope, Send, WatchedSend, send_json
from dualpath_cli.limits import LIMITS, limit_value

__all__ = ["BodyLimit"]


class _TooLarge(HTTPException):
    """The body grew past the limit while a handler was receiving it: an HTTP error, so
    the app's own handler answers 413 (a plain exception would be a 500)."""

    def __init__(self, detail: str) -> None:
        super().__init__(413, detail)


class BodyLimit:
    """Wrap ``app`` so that request bodies over ``most`` bytes get HTTP 413."""

    def __init__(self, app: ASGIApp, most: int | None = None) -> None:
        self.app = app
        self.most = int(limit_value("request_bytes")) if most is None else most

    def _detail(self) -> str:
        return (f"request body larger than the limit of {self.most:,} bytes (the server's "
                f"{LIMITS['request_bytes'].env_var})")

    async def _refuse(self, send: Send, status: int, detail: str) -> None:
        await send_json(send, status, {"detail": detail}, [(b"connection", b"close")])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._refuse(send, 400, "Content-Length is not a number")
                    return
                if declared > self.most:
                    await self._refuse(send, 413, self._detail())
                    return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message.get("type") == "http.request":
                received += len(message.get("body", b""))
                if received > self.most:
                    raise _TooLarge(self._detail())
            return message

        answer = WatchedSend(send)
        try:
            await self.app(scope, counted, answer)
        except _TooLarge:
            if not answer.started:
                await self._refuse(send, 413, self._detail())
