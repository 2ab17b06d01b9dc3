"""A request that fails inside the API answers 500 and leaves its connection open.

Why: Starlette's outermost error middleware answers an unhandled exception with 500 and then
re-raises it, so uvicorn closes the connection: the next request a keep-alive client sends
on it is reset (issue 34 item 3). This middleware sits inside that one, logs the bug once,
answers ``{"detail": "internal error: ..."}`` with 500 when no answer has started, and does
not re-raise, so one bad request costs only its own answer. A plain ASGI middleware, like
the others in this package (api/asgi.py).
"""

from __future__ import annotations

import logging

from dualpath_cli.api.asgi import ASGIApp, Receive, Scope, Send, WatchedSend, send_json

__all__ = ["ContainErrors"]

log = logging.getLogger("dualpath.api")


def _detail(err: BaseException) -> str:
    text = " ".join(f"internal error: {type(err).__name__}: {err}".split())
    return text[:1000]


class ContainErrors:
    """Wrap ``app``: an exception it raises becomes a 500 answer, never a dropped
    connection (unless half an answer was already sent)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        answer = WatchedSend(send)
        try:
            await self.app(scope, receive, answer)
        except Exception as err:  # the one place a bug becomes a 500
            log.exception("unhandled error in a request")
            if answer.ended:  # the answer went out whole: the connection is fine
                return
            if answer.started:  # half an answer is out: only closing the connection ends it
                raise
            await send_json(send, 500, {"detail": _detail(err)})
