"""core's in-place fetch fast paths give exactly what the copying public functions give.

``pe_fetch``/``de_place`` are now their ``*_in_place`` twins applied to copies, and
``de_place``/``pick_de`` were tightened for speed; the references below are the straightforward
implementations they replaced (kept verbatim), so equality here, floats included, proves the
behaviour did not move.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath_cli.core.de_schedule import (
    de_place,
    de_place_in_place,
    hbm_bounded_count,
    pick_de,
    z_threshold,
)
from dualpath_cli.core.pe_fetch import pe_fetch, pe_fetch_in_place, pick_pe
from dualpath_cli.core.types import EngineSnapshot, Request, Role


def _ref_pick_de(engines: Sequence[EngineSnapshot], length: int,
                 z: float) -> EngineSnapshot | None:
    normal: EngineSnapshot | None = None
    high: EngineSnapshot | None = None
    for e in engines:
        if e.hbm_free < length:
            continue
        if e.tok + length <= z:
            if normal is None or (e.seq, e.tok, e.engine_id) < (
                    normal.seq, normal.tok, normal.engine_id):
                normal = e
        elif normal is None and (high is None or (e.tok, e.engine_id) < (
                high.tok, high.engine_id)):
            high = e
    return normal if normal is not None else high


def _ref_de_place(queue: Sequence[Request], engines: Sequence[EngineSnapshot],
                  z_factor: float) -> tuple[object, ...]:
    work = [e.copy() for e in engines]
    live = [e for e in work if e.healthy]
    if not live:
        return ((), tuple(queue), tuple(work), 0.0, 0, "no_engines")
    r_count = hbm_bounded_count(queue, sum(e.hbm_free for e in live))
    z = z_threshold(sum(r.length for r in queue[:r_count]), live, z_factor)
    assignments: list[tuple[int, int]] = []
    n = 0
    stop = "queue_empty"
    for r in queue:
        e = _ref_pick_de(live, r.length, z)
        if e is None:
            stop = "no_hbm"
            break
        e.tok += r.length
        e.seq += 1
        e.hbm_free -= r.length
        assignments.append((r.request_id, e.engine_id))
        n += 1
    return (tuple(assignments), tuple(queue[n:]), tuple(work), z, r_count, stop)


def _ref_pe_fetch(queue: Sequence[Request], engines: Sequence[EngineSnapshot], alpha: int,
                  beta: int) -> tuple[object, ...]:
    work = [e.copy() for e in engines]
    assignments: list[tuple[int, int]] = []
    stop = "queue_empty"
    for r in queue:
        e = pick_pe(work, alpha, beta)
        if e is None:
            stop = "all_overloaded"
            break
        e.tok += r.length
        e.seq += 1
        assignments.append((r.request_id, e.engine_id))
    return (tuple(assignments), len(assignments), tuple(work), stop)


_DE_SPECS = st.lists(st.tuples(st.integers(0, 50_000), st.integers(0, 20),
                               st.integers(0, 120_000), st.booleans()), max_size=8)


def _des(specs: list[tuple[int, int, int, bool]]) -> list[EngineSnapshot]:
    return [EngineSnapshot(i, 1, 1, Role.DECODE, seq, tok, 0, hbm, h)
            for i, (tok, seq, hbm, h) in enumerate(specs)]


@settings(max_examples=300, deadline=None)
@given(_DE_SPECS, st.lists(st.integers(1, 40_000), max_size=25),
       st.sampled_from([1.0, 1.05, 1.2, 1.37]))
def test_de_place_matches_the_reference_bit_for_bit(
        specs: list[tuple[int, int, int, bool]], lengths: list[int], zf: float) -> None:
    engines = _des(specs)
    before = [e.copy() for e in engines]
    queue = [Request(i, n) for i, n in enumerate(lengths)]
    res = de_place(queue, engines, zf)
    got = (res.assignments, res.remaining, res.engines, res.z, res.r_count, res.stop_reason)
    assert got == _ref_de_place(queue, engines, zf)
    assert engines == before  # the public function never touches its input
    # the in-place twin leaves the caller's snapshots exactly as the result's copies
    assignments, z, r_count, stop = de_place_in_place(queue, engines, zf)
    assert (tuple(assignments), z, r_count, stop) == (res.assignments, res.z, res.r_count,
                                                      res.stop_reason)
    assert tuple(engines) == res.engines


@settings(max_examples=300, deadline=None)
@given(_DE_SPECS, st.integers(1, 40_000), st.floats(0, 200_000, allow_nan=False))
def test_pick_de_matches_the_reference(specs: list[tuple[int, int, int, bool]], length: int,
                                       z: float) -> None:
    engines = _des(specs)
    assert pick_de(engines, length, z) is _ref_pick_de(engines, length, z)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2_000), st.integers(0, 300), st.booleans()),
                max_size=8),
       st.lists(st.integers(1, 800), max_size=30))
def test_pe_fetch_matches_the_reference_and_its_in_place_twin(
        specs: list[tuple[int, int, bool]], lengths: list[int]) -> None:
    engines = [EngineSnapshot(i, 0, 0, Role.PREFILL, 0, tok, rq, 0, h)
               for i, (tok, rq, h) in enumerate(specs)]
    before = [e.copy() for e in engines]
    queue = [Request(i, n) for i, n in enumerate(lengths)]
    res = pe_fetch(queue, engines, 100, 1000)
    got = (res.assignments, res.consumed, res.engines, res.stop_reason)
    assert got == _ref_pe_fetch(queue, engines, 100, 1000)
    assert engines == before
    assignments, stop = pe_fetch_in_place(iter(queue), engines, 100, 1000)
    assert (tuple(assignments), stop) == (res.assignments, res.stop_reason)
    assert tuple(engines) == res.engines
