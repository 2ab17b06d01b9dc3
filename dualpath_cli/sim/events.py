"""The event loop: a heap of (time, seq, kind, payload) in simulated seconds.

Why a bare heap and integer kinds instead of callback objects: the simulator must run millions
of turns per core-minute, and a tuple push/pop plus a list lookup is the cheapest dispatch
Python offers. ``seq`` breaks time ties in insertion order, so runs are deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

__all__ = ["EventLoop"]


class EventLoop:
    """A min-heap of timed events dispatched to handlers registered by kind.

    Events at equal times run in the order they were scheduled (FIFO), never by payload.
    """

    __slots__ = ("now", "_heap", "_seq", "_handlers", "events")

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
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
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, kind, payload))

    def after(self, delay: float, kind: int, payload: Any = None) -> None:
        """Schedule ``kind`` ``delay`` seconds from now."""
        self.at(self.now + delay, kind, payload)

    def __len__(self) -> int:
        return len(self._heap)

    def run(self, until: float = float("inf"), stop: Callable[[], bool] | None = None) -> float:
        """Dispatch events in time order until the heap empties, ``until`` or ``stop()``.

        Returns the simulated time reached.
        """
        heap, handlers, pop = self._heap, self._handlers, heapq.heappop
        n = 0
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
