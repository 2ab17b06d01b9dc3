"""A turn as the scheduler holds it: the request, its result, the ticket a caller waits on,
and its state in flight.

Why apart from the scheduler: callers (the live cluster, the API, the runner) hand in a
:class:`TurnRequest` and wait on a :class:`Ticket` without needing the scheduler's
machinery; :class:`Flight` is what the scheduler's queues and its checkpoint carry.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from dualpath_cli.errors import DualPathError
from dualpath_cli.runtime.wire import KeyArray, TokenArray

__all__ = ["TurnRequest", "TurnResult", "Latch", "TokenStream", "TurnCancelled", "Ticket",
           "RoutePass", "Routed", "Flight"]

log = logging.getLogger(__name__)

_NO_KEYS = KeyArray([])  # a turn's keys before its lookup (read-only: shared)
_NO_PROMPT = TokenArray([])  # a turn's prompt frame before its lookup (read-only: shared)


@dataclass
class TurnRequest:
    """One agent turn: the full prompt (context + appended tokens) and tokens to generate."""

    agent: int
    turn: int
    tokens: np.ndarray
    gen: int
    stream: bool = False  # report tokens as the DE makes them (a :class:`TokenStream`)


@dataclass
class TurnResult:
    """What came back for a turn, with its timeline (monotonic seconds)."""

    tokens: list[int]
    submitted: float
    first_at: float
    done_at: float
    cached: int
    attempts: int
    pe: int
    de: int
    pe_tokens: int
    rx_from_pe: int
    second_at: float = 0.0


class Latch:
    """A one-shot :class:`threading.Event` (``set``, ``is_set``, ``wait``) made of one lock.

    Why: every turn's ticket holds two; an ``Event`` builds a ``Condition`` in Python (a
    lock, a deque, bound methods), a few microseconds per turn at 2,400 turns/s on the
    scheduler's thread. Here the lock is held from creation until :meth:`set`; a waiter
    acquires it (blocking) and hands it straight back.
    """

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        try:
            self._lock.release()
        except RuntimeError:  # a racing set() released it first
            pass

    def wait(self, timeout: float | None = None) -> bool:
        """True once set; False if ``timeout`` seconds passed first."""
        if self._set:
            return True
        if self._lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            try:
                self._lock.release()
            except RuntimeError:  # two racing set() calls released it under us
                pass
            return True
        return self._set


class TurnCancelled(DualPathError):
    """The turn was cancelled by its caller (a streaming client went away)."""


class TokenStream:
    """A streamed turn's output so far, as its DE reports it (thread-safe, bounded by the
    turn's ``gen``): the scheduler's thread :meth:`put`-s, a reader takes :meth:`since`.

    ``notify`` (set by the reader) is called after each put that added tokens, on the
    scheduler's thread: it must be quick and take no lock (hand the wake-up to the reader's
    loop, coalesced). Positions make a retried attempt's repeat of tokens already here
    harmless (greedy decoding gives the same tokens).
    """

    __slots__ = ("_tokens", "_lock", "limit", "notify")

    def __init__(self, limit: int) -> None:
        self._tokens: list[int] = []
        self._lock = threading.Lock()
        self.limit = limit
        self.notify: Callable[[], None] | None = None

    def put(self, start: int, tokens: tuple[int, ...]) -> None:
        """Tokens from output position ``start`` on (a gap or a repeat is dropped)."""
        with self._lock:
            have = len(self._tokens)
            if start > have or start + len(tokens) <= have:
                return
            self._tokens.extend(tokens[have - start:self.limit - start])
        fn = self.notify
        if fn is not None:
            fn()

    def since(self, n: int) -> list[int]:
        """The tokens from position ``n`` on."""
        with self._lock:
            return self._tokens[n:]


class Ticket:
    """A handle to wait on a turn's result (and, when streamed, on its tokens so far).
    ``rid``: the scheduler's request id of the turn (``None``: a kept answer restored
    without one)."""

    def __init__(self, stream: TokenStream | None = None,
                 cancel: Callable[[], None] | None = None, *, rid: int | None = None) -> None:
        self.rid = rid
        self.event = Latch()
        self.result: TurnResult | None = None
        self.first_event = Latch()
        self.error: Exception | None = None
        self.stream = stream
        self._cancel = cancel
        self._callbacks: list[Callable[[], None]] = []
        self._callbacks_lock = threading.Lock()

    def cancel(self) -> None:
        """Give the turn up: its scheduler drops it and tells its engines to free what they
        hold; the ticket fails with :class:`TurnCancelled`. No-op once done."""
        if self._cancel is not None and not self.event.is_set():
            self._cancel()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once the turn is done (at once if it already is).

        It runs on the thread that finishes the turn, often with the scheduler's lock held,
        so it must be quick, must not raise and must take no lock a submitter may hold
        while it waits for the scheduler (hand the work to another thread instead). Why: an
        event loop waiting on a turn then needs no thread of its own blocked in
        :meth:`wait` (each thread hand-off is a wake-up on the request's critical path).
        """
        with self._callbacks_lock:
            if not self.event.is_set():
                self._callbacks.append(fn)
                return
        fn()

    def finish(self) -> None:
        """Mark the turn done (its ``result`` or ``error`` is set): wake waiters, run callbacks."""
        self.first_event.set()
        with self._callbacks_lock:
            self.event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn()
            except Exception:  # a waiter's bug must not stop the scheduler
                log.exception("a turn's done callback failed")

    def wait(self, timeout: float | None = None) -> TurnResult:
        """Block until the turn is done; raises the error it was failed with, if any."""
        if not self.event.wait(timeout):
            raise TimeoutError("turn did not finish in time")
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result

    def fail(self, error: Exception) -> None:
        """Answer the turn with ``error`` instead of a result (a stopping cluster cut it off)."""
        self.error = error
        self.finish()


class RoutePass:
    """One DE phase-1 routing pass, shared by the turns it routed: the queue's head, every
    live group's load before the pass and each turn's (group, tokens) in routing order.
    Why: a turn's decision shows the loads just before its routing; a copy of every
    group's load per turn (96 groups at 48P96D) cost more than the routing, so it is made
    only when the decision is read."""

    __slots__ = ("head", "base", "steps")

    def __init__(self, head: list[int], base: dict[int, int]) -> None:
        self.head = head
        self.base = base
        self.steps: list[tuple[int, int]] = []

    def route(self, i: int) -> dict[str, Any]:
        """The ``i``-th routed turn's phase-1 inputs and outcome (``de_route``)."""
        loads = dict(self.base)
        for g, tokens in itertools.islice(self.steps, i):
            loads[g] += tokens
        return {"queue_head": self.head, "group_loads": loads, "group": self.steps[i][0]}


class Routed(NamedTuple):
    """A turn's place in a :class:`RoutePass`."""

    routing: RoutePass
    at: int  # its index in the pass's steps

    def as_dict(self) -> dict[str, Any]:
        return self.routing.route(self.at)


@dataclass
class Flight:
    """A turn inside the scheduler: where it stands (attempt, lookup, engines, charges) and
    the inputs its decisions will show."""

    rid: int
    req: TurnRequest
    ticket: Ticket
    submitted: float
    att: int = 0
    cached: int = 0
    keys: KeyArray = field(default_factory=lambda: _NO_KEYS)  # the hit blocks' keys
    prompt: TokenArray = field(default_factory=lambda: _NO_PROMPT)  # int32, by the lookup
    generation: Hashable | None = None  # the store's removal generation at the lookup
    max_hit_blocks: int | None = None
    pe: int = -1
    de: int = -1
    de_group: int = -1
    pe_tokens: int = 0
    charges: list[tuple[int, int]] = field(default_factory=list)  # (engine, dispatch seq)
    prefilled: bool = False
    first_at: float = 0.0
    route: Routed | None = None  # DE phase-1 inputs and outcome
    place: dict[str, Any] = field(default_factory=dict)  # DE phase-2 inputs and outcome
