"""``x-request-id`` on every answer: the turn's own where a route set it, else one for logs.

Why: an operator correlating a client's log with the server's wants one id per exchange. An
OpenAI route answers a turn with the scheduler's request id (api/openai_routes.py); every
other answer (and a refusal before a turn was admitted) gets the client's own
``x-request-id`` back when it sent a usable one, else a generated ``req-<16 hex>`` (never
digits only, so it is not mistaken for a scheduler's id). A plain ASGI middleware
(api/asgi.py): streaming responses pass untouched, and it costs a header look-up.
"""

from __future__ import annotations

import secrets

from dualpath_cli.api.asgi import ASGIApp, Message, Receive, Scope, Send, WatchedSend
from dualpath_cli.telemetry.request_ids import valid_alias

__all__ = ["RequestIdHeader", "HEADER"]

HEADER = b"x-request-id"


def _client_id(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name == HEADER:
            try:
                text = value.decode("ascii")
            except UnicodeDecodeError:
                return None
            return value if valid_alias(text) else None
    return None


class RequestIdHeader:
    """Wrap ``app`` so that every HTTP answer carries ``x-request-id``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        def tag(start: Message) -> None:
            headers = list(start.get("headers", ()))
            if not any(name.lower() == HEADER for name, _ in headers):
                rid = _client_id(scope) or f"req-{secrets.token_hex(8)}".encode()
                start["headers"] = [*headers, (HEADER, rid)]

        await self.app(scope, receive, WatchedSend(send, on_start=tag))
