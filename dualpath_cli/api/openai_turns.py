"""Waiting on an admitted turn from the event loop without blocking it.

Why: each request's tokens and end arrive on scheduler threads; every hand-off between
threads is a wake-up on the request's critical path, so :class:`Turn` uses as few as it can.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from dualpath_cli.api.openai_errors import OpenAIError, draining_error
from dualpath_cli.errors import DualPathError
from dualpath_cli.services.live import Draining, LiveCluster, Ticket, TurnResult

__all__ = ["Turn", "turn_result"]


class Turn:
    """One admitted turn whose end (and, streamed, whose tokens) wake the event loop.

    ``submit`` runs on the loop (a lock and the prefix lookup: well under a millisecond).
    The ticket's done callback, run by the scheduler thread that finishes the turn, hands
    the end straight to the loop (one wake-up; a timer on the loop answers a turn that runs
    past ``timeout``). A streamed turn's ticket also calls back as its tokens arrive (a
    step of its DE's decode each): those wake-ups are coalesced, one pending at a time,
    so a slow reader costs the scheduler's thread nothing but a flag test. No thread of
    the API blocks: a streaming client that goes away cancels the turn (:meth:`cancel`).
    """

    def __init__(self, live: LiveCluster, ticket: Ticket, timeout: float,
                 keep: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self.keep = keep  # never cancel (an idempotency key's client comes back for it)
        self.loop = loop
        self.ticket = ticket
        self.live = live
        self.done: asyncio.Future[bool] = loop.create_future()
        self._news = asyncio.Event()  # new tokens, the end or the timeout
        self._pending = False  # a wake-up is on its way to the loop
        self._timer = loop.call_later(timeout, self._expire)
        if ticket.stream is not None:
            ticket.stream.notify = self._notify
        ticket.add_done_callback(self._on_done)

    def _notify(self) -> None:
        """The ticket's stream callback, on the scheduler's thread: one wake-up pending at
        most (the reader takes every token there is when it wakes)."""
        if self._pending:
            return
        self._pending = True
        try:
            self.loop.call_soon_threadsafe(self._wake)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting any more

    def _wake(self) -> None:
        self._pending = False
        self._news.set()

    def _on_done(self) -> None:
        """The ticket's done callback, on the scheduler thread that finished the turn (with
        its lock held): only hand the end to the loop. Releasing the ticket takes the live
        cluster's lock, which a request thread holds while it submits (and waits for the
        scheduler's lock): done here, that is a lock-order deadlock, so the loop does it."""
        def deliver() -> None:
            self.live.done(self.ticket)
            self._timer.cancel()
            if not self.done.done():  # else the request went away or timed out
                self.done.set_result(True)
            self._news.set()
        try:
            self.loop.call_soon_threadsafe(deliver)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting any more

    def _expire(self) -> None:
        """On the loop: the turn ran past its timeout (the ticket stays until it ends)."""
        if not self.done.done():
            self.done.set_result(False)
        self._news.set()

    async def started(self) -> None:
        """Until the turn has tokens to stream, or has ended (or timed out)."""
        stream = self.ticket.stream
        while not self.done.done() and not (stream is not None and stream.since(0)):
            await self._news.wait()
            self._news.clear()

    async def tokens(self) -> AsyncIterator[list[int]]:
        """The streamed tokens as they come, in runs, until the turn ends (or times out);
        an unstreamed ticket yields nothing (its result has the tokens)."""
        stream, n = self.ticket.stream, 0
        while True:
            ended = self.done.done()
            got = stream.since(n) if stream is not None else []
            if got:
                n += len(got)
                yield got
            if ended:
                return
            await self._news.wait()
            self._news.clear()

    def cancel(self) -> None:
        """Give the turn up if it is still running (its client went away), unless it is
        kept for a resubmission under its idempotency key."""
        if not self.keep and not self.ticket.event.is_set():
            self.ticket.cancel()


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
