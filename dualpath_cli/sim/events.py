"""The event loop: a heap of (time, seq, kind, payload) in simulated seconds.

Why a bare heap and integer kinds instead of callback objects: the simulator must run millions
of turns per core-minute, and a tuple push/pop plus a list lookup is the cheapest dispatch
Python offers. ``seq`` breaks time ties in insertion order, so runs are deterministic.

The heap and the ``seq`` source are public (:attr:`EventLoop.heap`, :attr:`EventLoop.ticket`)
so a hot path that knows its time is not in the past can push ``(time, loop.ticket(), kind,
payload)`` itself and save a method call per event; :meth:`EventLoop.at` is exactly that plus
the clamp to now.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

__all__ = ["EventLoop"]


class EventLoop:
    """A min-heap of timed events dispatched to handlers registered by kind.

    Events at equal times run in the order they were scheduled (FIFO), never by payload.
    """

    __slots__ = ("now", "heap", "ticket", "_handlers", "events")

    def __init__(self) -> None:
        self.now = 0.0
        self.heap: list[tuple[float, int, int, Any]] = []
        self.ticket: Callable[[], int] = itertools.count(1).__next__  # the next seq
        self._handlers: list[Callable[[Any], None]] = []
        self.events = 0

    def register(self, handler: Callable[[Any], None]) -> int:
        """Register ``handler(payload)``; returns the kind to schedule it with."""
        self._handlers.append(handler)
        return len(self._handlers) - 1

    def at(self, time: float, kind: int, payload: Any = None) -> None:
        """Schedule ``kind`` at absolute ``time`` (never earlier than now)."""
        if time < self.now:
            time = self.now
        heapq.heappush(self.heap, (time, self.ticket(), kind, payload))

    def after(self, delay: float, kind: int, payload: Any = None) -> None:
        """Schedule ``kind`` ``delay`` seconds from now."""
        self.at(self.now + delay, kind, payload)

    def __len__(self) -> int:
        return len(self.heap)

    def run(self, until: float = float("inf"), stop: Callable[[], bool] | None = None) -> float:
        """Dispatch events in time order until the heap empties, ``until`` or ``stop()``.

        Returns the simulated time reached. The common case (no ``stop``) runs a loop with
        nothing in it but the pop and the dispatch: it is the simulator's innermost loop.
        """
        heap, handlers, pop = self.heap, self._handlers, heapq.heappop
        n = 0
        if stop is None and until == float("inf"):
            while heap:
                time, _, kind, payload = pop(heap)
                self.now = time
                handlers[kind](payload)
                n += 1
        else:
            while heap:
                if heap[0][0] > until:
                    self.now = until
                    break
                time, _, kind, payload = pop(heap)
                self.now = time
                handlers[kind](payload)
                n += 1
                if stop is not None and stop():
                    break
        self.events += n
        return self.now
