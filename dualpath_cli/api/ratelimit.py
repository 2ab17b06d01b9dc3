"""Request rate limit: a token bucket per client address; over it, HTTP 429 with Retry-After.

Why per address: one misbehaving client (a retry loop, a script without backoff) must not
starve the scheduler's event loop for everyone else; a bucket per address lets a burst
through and then holds each client to its rate. The limit is ``cluster.api_rate_limit``
requests per second per address (default 5,000: ``bench/api.py``'s 16 clients and every
test come from 127.0.0.1 and stay far below it), raised or lowered for one server with
``DUALPATH_LIMIT_API_RATE`` (``dualpath_cli.limits``); 0 in the config turns it off.

Monitoring is never throttled by work: read-only requests (GET, HEAD, OPTIONS: ``/metrics``,
``/api/v1/status`` and the rest that the TUI, ``dualpath monitor`` and Prometheus poll) draw
from a second bucket of the same address with four times the budget, so a client that
floods POSTs still sees its status and metrics, and a scrape storm cannot block turns.

The hot path is one dict lookup and a few float operations on the event loop's thread (an
ASGI middleware runs there, so no lock); the table of addresses is pruned of full buckets
when it passes :data:`MAX_CLIENTS`, so spoofed or many addresses cannot grow it without bound.
Pure standard library, like ``bodylimit.py``: a plain ASGI middleware, streaming untouched.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

from dualpath_cli.api.asgi import ASGIApp, Receive, Scope, Send, send_json
from dualpath_cli.limits import LIMITS, limit_value

__all__ = ["RateLimit", "READ_FACTOR", "MAX_CLIENTS", "DEFAULT_RATE", "rate_in_force"]

#: Requests per second per client address when nothing says otherwise.
DEFAULT_RATE = 5000.0
#: Read-only requests get this many times the budget, in a bucket of their own.
READ_FACTOR = 4.0
#: Addresses kept before full (idle) buckets are dropped.
MAX_CLIENTS = 4096
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def rate_in_force(configured: float) -> float:
    """The rate a server uses: ``DUALPATH_LIMIT_API_RATE`` when set (one server's override,
    as for every limit), else ``configured`` (``cluster.api_rate_limit``; 0: no limit)."""
    if os.environ.get(LIMITS["api_rate"].env_var):
        return limit_value("api_rate")
    return float(configured)


class RateLimit:
    """Wrap ``app`` so that a client address over ``rate`` requests/s gets HTTP 429.

    Args:
        app: the ASGI app.
        rate: requests per second per address (read-only ones: ``READ_FACTOR`` times as
            many, in their own bucket); None reads ``DUALPATH_LIMIT_API_RATE`` or the
            default; 0 or less turns the limit off.
        burst_s: seconds of the rate a full bucket holds (a burst let through at once).
        clock: the monotonic clock (tests pass their own).
    """

    def __init__(self, app: ASGIApp, rate: float | None = None, *, burst_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.rate = limit_value("api_rate") if rate is None else float(rate)
        self.on = math.isfinite(self.rate) and self.rate > 0
        self.burst_s = burst_s
        self.clock = clock
        # (address, read?) -> [tokens, last refill time]
        self._buckets: dict[tuple[str, bool], list[float]] = {}
        self.refused = 0
        self._pruned = -math.inf

    def _prune(self, now: float) -> None:
        """Drop the buckets that have refilled (their clients are idle): amortised O(1)."""
        full = [key for key, (tokens, last) in self._buckets.items()
                if now - last >= self.burst_s]
        for key in full:
            del self._buckets[key]

    def _take(self, client: str, read: bool) -> float:
        """Take one token from ``client``'s bucket; the seconds to wait when it is empty."""
        rate = self.rate * READ_FACTOR if read else self.rate
        most = rate * self.burst_s
        now = self.clock()
        key = (client, read)
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_CLIENTS and now - self._pruned >= self.burst_s:
                self._pruned = now  # one scan per burst at most, however many newcomers
                self._prune(now)
            if len(self._buckets) < MAX_CLIENTS:
                self._buckets[key] = [most - 1.0, now]
                return 0.0
            # every tracked client is active: the rest share one bucket (memory stays bounded)
            key = ("", read)
            bucket = self._buckets.setdefault(key, [most, now])
        tokens = min(most, bucket[0] + (now - bucket[1]) * rate)
        bucket[1] = now
        if tokens >= 1.0:
            bucket[0] = tokens - 1.0
            return 0.0
        bucket[0] = tokens
        return (1.0 - tokens) / rate

    async def _refuse(self, scope: Scope, send: Send, wait_s: float, read: bool) -> None:
        self.refused += 1
        retry = max(1, math.ceil(wait_s))
        kind = "read-only " if read else ""
        message = (f"rate limit: more than {self.rate * (READ_FACTOR if read else 1):g} "
                   f"{kind}requests per second from this address; retry after {retry} s "
                   f"(the server's cluster.api_rate_limit or {LIMITS['api_rate'].env_var})")
        if str(scope.get("path", "")).startswith("/v1/"):  # the OpenAI routes' error shape
            payload: dict[str, Any] = {"error": {"message": message, "type": "requests",
                                                 "param": None,
                                                 "code": "rate_limit_exceeded"}}
        else:
            payload = {"detail": message}
        await send_json(send, 429, payload, [(b"retry-after", str(retry).encode())])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.on or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        address = str(client[0]) if client else ""
        read = scope.get("method", "GET") in _READ_METHODS
        wait_s = self._take(address, read)
        if wait_s > 0:
            await self._refuse(scope, send, wait_s, read)
            return
        await self.app(scope, receive, send)
