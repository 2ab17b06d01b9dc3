"""DE scheduling in two phases (paper section 6.3): across groups, then inside one group.

Phase 1 drains the global queue when any DE group fetches: each request goes to the group whose
total token load is minimum, and that load grows by ``len_r`` before the next request (the
paper does not say so; without it a whole drain lands on one group). A group's load is what the
caller puts in :class:`GroupLoads`: normally the reported sum of ``tok_e`` plus the lengths
already routed to its private queue (see :func:`group_load`). A lazy min-heap keeps each
routing at O(log groups) instead of a scan over all groups.

Phase 2 places the fetching group's private queue on its DEs:

1. ``R`` = the longest head of the queue whose total length fits in the group's total free HBM
   (ignoring fragmentation);
2. ``Z = z_factor * (sum of len_r over R + sum of tok_e over E) / |E|``;
3. pop the head ``r``; among DEs with ``hbm_free >= len_r``: a normal DE (``tok + len_r <= Z``)
   with minimum ``seq``, else a high-token DE with minimum ``tok``; if none has the HBM, stop.
   Each placement adds ``len_r`` to ``tok``, 1 to ``seq`` and takes ``len_r`` of ``hbm_free``.

``E`` is the group's healthy engines; an unhealthy DE neither counts nor receives. Walking past
``R`` is never needed: once ``R`` is placed the free HBM left is below the next length, so no
DE can take it and the stop rule ends the fetch the same way.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from dualpath_cli.core.frozen import by_fields
from dualpath_cli.core.types import EngineSnapshot, Request

__all__ = [
    "DEClass",
    "classify_de",
    "placement_classes",
    "GroupLoads",
    "RouteResult",
    "DEPlaceResult",
    "group_load",
    "de_route",
    "de_route_in_place",
    "hbm_bounded_count",
    "z_threshold",
    "pick_de",
    "de_place",
    "de_place_in_place",
    "place_under_z",
]

DEFAULT_Z_FACTOR = 1.05


class GroupLoads:
    """Token load per DE group with O(log n) minimum lookup (a lazily cleaned heap).

    Ties go to the lower group id. Plain data: no clocks or I/O; :meth:`copy` gives an
    independent instance so phase 1 can stay a function of its inputs.
    """

    __slots__ = ("_load", "_heap")

    def __init__(self, loads: Mapping[int, int]) -> None:
        self._load: dict[int, int] = dict(loads)
        self._heap: list[tuple[int, int]] = [(v, g) for g, v in self._load.items()]
        heapq.heapify(self._heap)

    def copy(self) -> GroupLoads:
        """An independent copy (O(groups), C speed)."""
        new = GroupLoads({})  # not __new__ alone: a class compiled by mypyc needs __init__
        new._load = self._load.copy()
        new._heap = self._heap.copy()
        return new

    def __len__(self) -> int:
        return len(self._load)

    def load(self, group: int) -> int:
        """Current load of ``group``."""
        return self._load[group]

    def as_dict(self) -> dict[int, int]:
        """A copy of every group's load."""
        return self._load.copy()

    def set(self, group: int, load: int) -> None:
        """Replace a group's load (e.g. from a fresh report); adds the group if new."""
        self._load[group] = load
        heapq.heappush(self._heap, (load, group))
        if len(self._heap) > 2 * len(self._load) + 16:
            self._heap = [(v, g) for g, v in self._load.items()]
            heapq.heapify(self._heap)

    def add(self, group: int, delta: int) -> None:
        """Grow (or shrink) a group's load by ``delta``."""
        self.set(group, self._load[group] + delta)

    def _clean_top(self) -> tuple[int, int]:
        heap, load = self._heap, self._load
        while True:
            top = heap[0]
            if load.get(top[1]) == top[0]:
                return top
            heapq.heappop(heap)

    def min_group(self) -> int:
        """The group with minimum load (lowest id on ties)."""
        if not self._load:
            raise ValueError("no DE groups")
        return self._clean_top()[1]

    def assign(self, length: int) -> int:
        """Route one request of ``length`` tokens: return the min group and grow its load."""
        if not self._load:
            raise ValueError("no DE groups")
        load, group = self._clean_top()
        new = load + length
        self._load[group] = new
        heapq.heapreplace(self._heap, (new, group))
        return group


@dataclass(frozen=True, slots=True)
class RouteResult:
    """Outcome of phase 1: ``(request_id, group)`` in FIFO order and the loads after it."""

    assignments: tuple[tuple[int, int], ...]
    loads: GroupLoads

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # a compiled frozen class pickles by its constructor


@dataclass(frozen=True, slots=True)
class DEPlaceResult:
    """Outcome of one DE group fetch (phase 2).

    Attributes:
        assignments: ``(request_id, engine_id)`` in FIFO order.
        remaining: the private queue left for the next fetch.
        engines: updated copies of the group's snapshots.
        z: the high-token threshold used (0.0 when the group has no healthy engine).
        r_count: ``|R|``, the HBM-bounded head of the queue.
        stop_reason: ``"queue_empty"``, ``"no_hbm"`` or ``"no_engines"``.
    """

    assignments: tuple[tuple[int, int], ...]
    remaining: tuple[Request, ...]
    engines: tuple[EngineSnapshot, ...]
    z: float
    r_count: int
    stop_reason: str

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # a compiled frozen class pickles by its constructor


def group_load(engines: Iterable[EngineSnapshot], queued: Iterable[Request] = ()) -> int:
    """A group's phase-1 load: reported ``tok`` of its engines plus lengths routed but unplaced."""
    return sum(e.tok for e in engines) + sum(r.length for r in queued)


def de_route(queue: Sequence[Request], loads: GroupLoads | Mapping[int, int]) -> RouteResult:
    """Phase 1: route every request of the global queue to the min-load group, in order.

    ``loads`` is not modified; the result carries the updated copy.
    """
    work = loads.copy() if isinstance(loads, GroupLoads) else GroupLoads(loads)
    return RouteResult(tuple(de_route_in_place(queue, work)), work)


def de_route_in_place(queue: Iterable[Request], loads: GroupLoads) -> list[tuple[int, int]]:
    """:func:`de_route` on the caller's own ``loads`` (grown as it routes): the assignments.

    Why: a caller that keeps the loads and adopts the routed ones anyway need not copy them
    (every DE group's) per fetch; :func:`de_route` is this function on a copy."""
    assign = loads.assign
    return [(r.request_id, assign(r.length)) for r in queue]


def hbm_bounded_count(queue: Sequence[Request], total_hbm: int) -> int:
    """``|R|``: how many head requests fit in ``total_hbm`` tokens if HBM never fragmented."""
    used = 0
    n = 0
    for r in queue:
        used += r.length
        if used > total_hbm:
            break
        n += 1
    return n


def z_threshold(r_tokens: int, engines: Sequence[EngineSnapshot],
                z_factor: float = DEFAULT_Z_FACTOR) -> float:
    """``Z = z_factor * (r_tokens + sum tok_e) / |E|`` over ``engines`` (all counted)."""
    if not engines:
        raise ValueError("Z needs at least one engine")
    return z_factor * (r_tokens + sum(e.tok for e in engines)) / len(engines)


def pick_de(engines: Sequence[EngineSnapshot], length: int, z: float) -> EngineSnapshot | None:
    """The DE for a request of ``length``: normal by min ``seq``, else high-token by min ``tok``.

    Only engines with ``hbm_free >= length`` qualify. Ties: lower ``tok`` then ``engine_id`` for
    normal DEs, lower ``engine_id`` for high-token ones. ``None`` when no DE has the HBM.
    """
    normal: EngineSnapshot | None = None
    high: EngineSnapshot | None = None
    for e in engines:  # comparisons spelled out: no key tuples in the per-request loop
        if e.hbm_free < length:
            continue
        tok = e.tok
        if tok + length <= z:
            if normal is None:
                normal = e
            else:
                seq, nseq = e.seq, normal.seq
                if seq < nseq or (seq == nseq and (tok < normal.tok or (
                        tok == normal.tok and e.engine_id < normal.engine_id))):
                    normal = e
        elif normal is None and (high is None or tok < high.tok or (
                tok == high.tok and e.engine_id < high.engine_id)):
            high = e
    return normal if normal is not None else high


class DEClass(str, Enum):
    """Which rule of step 3 placed a request: a normal DE (under Z) or a high-token one."""

    NORMAL = "normal"
    HIGH_TOKEN = "high_token"


def classify_de(engine: EngineSnapshot, length: int, z: float) -> DEClass:
    """The class of ``engine`` for a request of ``length`` under ``z`` (``tok + len <= Z``).

    :func:`pick_de` prefers a normal DE, so a request lands on a high-token DE only when no
    DE with the HBM is normal.
    """
    return _de_class(engine.tok, length, z)


def _de_class(tok: int, length: int, z: float) -> DEClass:
    return DEClass.NORMAL if tok + length <= z else DEClass.HIGH_TOKEN


def placement_classes(queue: Sequence[Request], engines: Sequence[EngineSnapshot],
                      assignments: Sequence[tuple[int, int]], z: float) -> list[DEClass]:
    """The class each of ``assignments`` (a :func:`de_place` result) was placed under.

    ``engines`` are the snapshots *before* the fetch and ``queue`` its private queue; the
    placements are replayed in order on copies (each adds ``len_r`` to its DE's ``tok``), so
    each request is classified against the DE as it was when that request was placed.
    Why: the decision log and the metrics count decisions by DE class, and
    :class:`DEPlaceResult` keeps only the outcome.
    """
    tok = {e.engine_id: e.tok for e in engines}
    out: list[DEClass] = []
    for r, (rid, de) in zip(queue, assignments, strict=False):
        if r.request_id != rid:
            raise ValueError(f"assignment {rid} is not the queue's request {r.request_id}")
        length = r.length
        out.append(_de_class(tok[de], length, z))
        tok[de] += length
    return out


def de_place(queue: Sequence[Request], engines: Sequence[EngineSnapshot],
             z_factor: float = DEFAULT_Z_FACTOR) -> DEPlaceResult:
    """Phase 2: place the group's private ``queue`` on its healthy DEs (see module doc)."""
    work = [e.copy() for e in engines]
    assignments, z, r_count, stop = de_place_in_place(queue, work, z_factor)
    return DEPlaceResult(tuple(assignments), tuple(queue[len(assignments):]), tuple(work), z,
                         r_count, stop)


def de_place_in_place(queue: Sequence[Request], engines: Sequence[EngineSnapshot],
                      z_factor: float = DEFAULT_Z_FACTOR,
                      ) -> tuple[list[tuple[int, int]], float, int, str]:
    """:func:`de_place` on the caller's own snapshots: ``(assignments, z, r_count, stop)``.

    Why: a caller that owns its snapshots and adopts the updated ones anyway need not pay for
    copies, the copied remainder of the queue and a result object. The healthy ``engines``
    are updated in place exactly as :func:`de_place` updates its copies; :func:`de_place` is
    this function applied to copies, so both always agree.
    """
    live = [e for e in engines if e.healthy]
    if not live:
        return [], 0.0, 0, "no_engines"
    r_count = hbm_bounded_count(queue, sum(e.hbm_free for e in live))
    z = z_threshold(sum(r.length for r in queue[:r_count]), live, z_factor)
    assignments, stop = place_under_z(queue, live, z)
    return assignments, z, r_count, stop


def place_under_z(queue: Iterable[Request], live: Sequence[EngineSnapshot],
                  z: float) -> tuple[list[tuple[int, int]], str]:
    """Step 3 of phase 2 alone: place from the head of ``queue`` on ``live`` (in place).

    Returns ``(assignments, stop)``; ``stop`` is ``"no_hbm"`` when a request found no DE with
    the HBM (it and the rest stay queued), else ``"queue_empty"``. ``queue`` is read lazily
    and at most one request past the last placed one is read. Why separate: a caller that
    already knows ``Z`` (say, from running totals and :func:`z_threshold`) can place without
    walking the HBM-bounded head again; :func:`de_place` uses it for the same loop.
    """
    assignments: list[tuple[int, int]] = []
    for r in queue:
        length = r.length
        d = pick_de(live, length, z)
        if d is None:
            return assignments, "no_hbm"
        d.tok += length
        d.seq += 1
        d.hbm_free -= length
        assignments.append((r.request_id, d.engine_id))
    return assignments, "queue_empty"
