"""Waiting on an admitted turn from the event loop without blocking it.

Why: each request's first token and end arrive on scheduler threads; every hand-off between
threads is a wake-up on the request's critical path, so :class:`Turn` uses as few as it can.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from dualpath_cli.api.openai_errors import OpenAIError, draining_error
from dualpath_cli.errors import DualPathError
from dualpath_cli.services.live import Draining, LiveCluster, Ticket, TurnResult

__all__ = ["Turn", "turn_result"]


class Turn:
    """One admitted turn whose first token and end arrive as event-loop futures.

    ``submit`` runs on the loop (a lock and the prefix lookup: well under a millisecond).
    A non-streamed turn needs only its end: the ticket's done callback, run by the scheduler
    thread that finishes the turn, hands it straight to the loop (one wake-up; a timer on
    the loop answers a turn that runs past ``timeout``). A streamed turn also needs its first
    token, so a worker of the router's pool does the two blocking waits and hands each
    outcome to the loop. Why so few hand-offs: every one between threads is a wake-up on the
    critical path (on a busy 2-core box about a millisecond each, most of the HTTP overhead),
    and starting a thread blocks the loop until that thread runs.
    """

    def __init__(self, pool: ThreadPoolExecutor, live: LiveCluster, ticket: Ticket,
                 timeout: float, stream: bool) -> None:
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.ticket = ticket
        self.first: asyncio.Future[bool] = loop.create_future()
        self.done: asyncio.Future[bool] = loop.create_future()
        self._args = (live, timeout, stream)
        if stream:
            pool.submit(self._wait)
            return
        self._timer = loop.call_later(timeout, self._expire)
        ticket.add_done_callback(self._on_done)

    def _post(self, *outcomes: tuple[asyncio.Future[bool], bool]) -> None:
        def deliver() -> None:
            for fut, value in outcomes:
                if not fut.done():  # else the request went away
                    fut.set_result(value)
        try:
            self.loop.call_soon_threadsafe(deliver)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting any more

    def _on_done(self) -> None:
        """The ticket's done callback, on the scheduler thread that finished the turn (with
        its lock held): only hand the end to the loop. Releasing the ticket takes the live
        cluster's lock, which a request thread holds while it submits (and waits for the
        scheduler's lock): done here, that is a lock-order deadlock, so the loop does it."""
        live = self._args[0]

        def deliver() -> None:
            live.done(self.ticket)
            self._timer.cancel()
            for fut in (self.first, self.done):
                if not fut.done():  # else the request went away or timed out
                    fut.set_result(True)
        try:
            self.loop.call_soon_threadsafe(deliver)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting any more

    def _expire(self) -> None:
        """On the loop: the turn ran past its timeout (the ticket stays until it ends)."""
        for fut in (self.first, self.done):
            if not fut.done():
                fut.set_result(False)

    def _wait(self) -> None:
        live, timeout, stream = self._args
        ticket = self.ticket
        try:
            t0 = time.monotonic()
            self._post((self.first, ticket.first_event.wait(timeout)))
            left = max(0.0, timeout - (time.monotonic() - t0))
            self._post((self.done, ticket.event.wait(left)))
        finally:
            live.done(ticket)


def turn_result(ticket: Ticket, timeout: float) -> TurnResult:
    """The finished ticket's result, or its error as an :class:`OpenAIError`."""
    try:
        return ticket.wait(0)
    except TimeoutError:
        raise OpenAIError(504, f"the turn did not finish within {timeout:g} s",
                          type_="timeout", code="timeout") from None
    except Draining as err:
        raise draining_error(err) from None
    except DualPathError as err:
        raise OpenAIError(500, str(err), type_="server_error") from None
