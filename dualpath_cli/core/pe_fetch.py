"""PE selection: the paper's fetch algorithm (section 6.2, Algorithm 1) and the seed's variant.

Why two: the paper classifies the fetching group's engines by ``tok`` against beta and by
their node's read queue against alpha, and falls back to long-read-queue engines; the seed's
``select_loading_path`` instead treats "long read queue" as unhealthy and moves the read to a
decode engine. Both are kept so the simulator can compare them.

Engine classes (all quantities in tokens):

* C1 overloaded: ``tok > beta`` (or unhealthy): never receives a request;
* C2 short read queue: ``read_q <= alpha`` and ``tok <= beta``: preferred;
* C3 long read queue: ``read_q > alpha`` and ``tok <= beta``.

For each request in FIFO order the engine with minimum ``tok`` in C2 (else C3) takes it and its
``tok``/``seq`` grow; the fetch stops when C2 and C3 are empty. Ties on ``tok`` go to the
engine whose node has the shorter read queue, then to the lower ``engine_id``, so results are
deterministic (the paper does not say how ties break).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from itertools import islice
from typing import Any

from dualpath_cli.core.frozen import by_fields
from dualpath_cli.core.types import EngineSnapshot, Request
from dualpath_cli.errors import NoAvailableEngine

__all__ = [
    "PEClass",
    "PEFetchResult",
    "classify_pe",
    "pick_pe",
    "pe_fetch",
    "pe_fetch_in_place",
    "select_loading_path",
]


class PEClass(IntEnum):
    """The paper's engine categories; lower value is never better (C1 is excluded)."""

    OVERLOADED = 1
    SHORT_READ = 2
    LONG_READ = 3

    @property
    def label(self) -> str:
        """The paper's name: ``C1``, ``C2`` or ``C3`` (what decision logs and metrics show)."""
        return f"C{int(self)}"


@dataclass(frozen=True, slots=True)
class PEFetchResult:
    """Outcome of one PE group fetch.

    Why ``consumed`` and not a copied queue: a fetch assigns a handful of requests from a
    queue that may hold thousands, so copying the rest on every call made a fetch O(queue).
    The caller drops the first ``consumed`` requests (they are exactly the assigned ones, in
    order); ``remaining`` is still offered, computed on demand, for callers that want a copy.

    Attributes:
        assignments: ``(request_id, engine_id)`` in FIFO order.
        consumed: how many requests from the head of the queue were assigned
            (``len(assignments)``).
        engines: updated copies of the group's snapshots (``tok``/``seq`` grown).
        stop_reason: ``"queue_empty"`` or ``"all_overloaded"``.
    """

    assignments: tuple[tuple[int, int], ...]
    consumed: int
    engines: tuple[EngineSnapshot, ...]
    stop_reason: str
    source: Iterable[Request] = field(default=(), repr=False, compare=False)

    @property
    def remaining(self) -> tuple[Request, ...]:
        """The queue left for the next fetch, copied now (head = first unassigned request).

        Only meaningful when the queue passed in is a collection not changed since the call
        (a one-shot iterator has already been advanced).
        """
        return tuple(islice(self.source, self.consumed, None))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # a compiled frozen class pickles by its constructor


def classify_pe(engine: EngineSnapshot, alpha: int, beta: int) -> PEClass:
    """The class of ``engine`` now; an unhealthy engine counts as overloaded."""
    if not engine.healthy or engine.tok > beta:
        return PEClass.OVERLOADED
    return PEClass.SHORT_READ if engine.read_q <= alpha else PEClass.LONG_READ


def pick_pe(engines: Sequence[EngineSnapshot], alpha: int,
            beta: int) -> EngineSnapshot | None:
    """The engine the next request goes to: min ``tok`` in C2, else in C3, else ``None``.

    Ties on ``tok`` go to the shorter node read queue, then the lower ``engine_id``. Why the
    read queue: a group may span nodes (``cluster.nodes_per_group``), and idle engines all
    have ``tok`` 0, so by id alone the first node would take every turn of a light load and
    the second node's NIC and GPUs would idle; within one node the queues are equal and the
    order is the id's, as before. One linear pass; a group is a few nodes' GPUs (8 each),
    so this is cheaper than any index.
    """
    best: EngineSnapshot | None = None
    best_long = True
    best_tok = 0
    for e in engines:
        tok = e.tok
        if tok > beta or not e.healthy:
            continue
        long_q = e.read_q > alpha
        if best is None:
            best, best_long, best_tok = e, long_q, tok
        elif long_q < best_long or (long_q == best_long and (
                tok < best_tok or (tok == best_tok and (
                    e.read_q < best.read_q or (e.read_q == best.read_q
                                               and e.engine_id < best.engine_id))))):
            best, best_long, best_tok = e, long_q, tok
    return best


def pe_fetch(queue: Iterable[Request], engines: Sequence[EngineSnapshot], alpha: int,
             beta: int) -> PEFetchResult:
    """Run one fetch of a PE group over the global FIFO ``queue`` (paper Algorithm 1).

    Cost is O(assigned requests x group size): the queue is read lazily from its head and
    reading stops at the first request no engine can take.

    Args:
        queue: the global waiting queue, head first (any iterable; read lazily, at most
            ``consumed + 1`` items). Not modified.
        engines: the fetching group's snapshots. Not modified; copies are updated.
        alpha: short-read-queue threshold in tokens.
        beta: unfinished-token upper limit in tokens.
    """
    work = [e.copy() for e in engines]
    assignments, stop = pe_fetch_in_place(queue, work, alpha, beta)
    return PEFetchResult(tuple(assignments), len(assignments), tuple(work), stop, queue)


def pe_fetch_in_place(queue: Iterable[Request], engines: Sequence[EngineSnapshot], alpha: int,
                      beta: int) -> tuple[list[tuple[int, int]], str]:
    """:func:`pe_fetch` on the caller's own snapshots: ``(assignments, stop_reason)``.

    Why: a caller that owns its snapshots and adopts the updated ones anyway (the simulator,
    hundreds of thousands of fetches per run) need not pay for copies and a result object.
    ``engines`` are updated in place exactly as :func:`pe_fetch` updates its copies;
    :func:`pe_fetch` is this function applied to copies, so both always agree.
    """
    assignments: list[tuple[int, int]] = []
    stop = "queue_empty"
    for r in queue:
        e = pick_pe(engines, alpha, beta)
        if e is None:
            stop = "all_overloaded"
            break
        e.tok += r.length
        e.seq += 1
        assignments.append((r.request_id, e.engine_id))
    return assignments, stop


def _healthy(e: EngineSnapshot, alpha: int, beta: int) -> bool:
    return e.healthy and e.read_q <= alpha and e.tok <= beta


def select_loading_path(pe_engines: Sequence[EngineSnapshot],
                        de_engines: Sequence[EngineSnapshot], alpha: int,
                        beta: int) -> EngineSnapshot:
    """The seed's ``select_loading_path``: the engine whose node should read the KV.

    A healthy PE (``read_q <= alpha`` and ``tok <= beta``) with minimum ``tok``; else a healthy
    DE with minimum ``tok``; else :class:`NoAvailableEngine`. The returned engine's ``role``
    says which read path to use. Ties go to the lower ``engine_id``.
    """
    for pool in (pe_engines, de_engines):
        ok = [e for e in pool if _healthy(e, alpha, beta)]
        if ok:
            return min(ok, key=lambda e: (e.tok, e.engine_id))
    raise NoAvailableEngine(
        f"no engine can load the KV: every PE and DE has read_q > alpha ({alpha} tokens) "
        f"or tok > beta ({beta} tokens) or is unhealthy")
