"""PE fetch (paper 6.2, Algorithm 1) and the seed's select_loading_path."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath_cli.core.pe_fetch import (
    PEClass,
    classify_pe,
    pe_fetch,
    pick_pe,
    select_loading_path,
)
from dualpath_cli.core.types import EngineSnapshot, Request, Role
from dualpath_cli.errors import NoAvailableEngine

ALPHA, BETA = 100, 1000


def pe(eid: int, tok: int = 0, read_q: int = 0, healthy: bool = True) -> EngineSnapshot:
    return EngineSnapshot(eid, node=0, group=0, role=Role.PREFILL, tok=tok, read_q=read_q,
                          healthy=healthy)


def reqs(*lengths: int) -> list[Request]:
    return [Request(i, n) for i, n in enumerate(lengths)]


def test_classes() -> None:
    assert classify_pe(pe(0, tok=1001), ALPHA, BETA) is PEClass.OVERLOADED
    assert classify_pe(pe(0, tok=1000, read_q=100), ALPHA, BETA) is PEClass.SHORT_READ
    assert classify_pe(pe(0, tok=0, read_q=101), ALPHA, BETA) is PEClass.LONG_READ
    assert classify_pe(pe(0, healthy=False), ALPHA, BETA) is PEClass.OVERLOADED


def test_hand_worked_fetch() -> None:
    # e0 in C2 with more tokens than e1 in C3: C2 wins until e0 passes beta; e2 is C1.
    engines = [pe(0, tok=100, read_q=10), pe(1, tok=50, read_q=500), pe(2, tok=2000)]
    res = pe_fetch(reqs(300, 300, 300, 300, 300, 700, 5), engines, ALPHA, BETA)
    # e0: 100 -> 400 -> 700 -> 1000 (still <= beta) -> 1300 (overloaded)
    # then C3: e1: 50 -> 350 -> 1050 (overloaded); the 7th request finds C2 and C3 empty.
    assert res.assignments == ((0, 0), (1, 0), (2, 0), (3, 0), (4, 1), (5, 1))
    assert [r.request_id for r in res.remaining] == [6]
    assert res.stop_reason == "all_overloaded"
    assert [(e.tok, e.seq) for e in res.engines] == [(1300, 4), (1050, 2), (2000, 0)]
    # inputs untouched
    assert [e.tok for e in engines] == [100, 50, 2000]


def test_c2_min_tok_and_tie_to_lower_id() -> None:
    engines = [pe(5, tok=300), pe(3, tok=200), pe(4, tok=200)]
    assert pick_pe(engines, ALPHA, BETA) is engines[1]


def test_unhealthy_never_chosen() -> None:
    engines = [pe(0, tok=0, healthy=False), pe(1, tok=900)]
    res = pe_fetch(reqs(10, 10), engines, ALPHA, BETA)
    assert {eid for _, eid in res.assignments} == {1}


def test_empty_queue() -> None:
    res = pe_fetch([], [pe(0)], ALPHA, BETA)
    assert res.assignments == () and res.remaining == () and res.stop_reason == "queue_empty"


def test_select_loading_path_seed_variant() -> None:
    pes = [pe(0, tok=50, read_q=500), pe(1, tok=900, read_q=0)]
    des = [EngineSnapshot(9, 1, 1, Role.DECODE, tok=10, read_q=0)]
    assert select_loading_path(pes, des, ALPHA, BETA).engine_id == 1  # healthy PE first
    pes[1].read_q = 101
    chosen = select_loading_path(pes, des, ALPHA, BETA)
    assert chosen.engine_id == 9 and chosen.role is Role.DECODE
    des[0].tok = BETA + 1
    with pytest.raises(NoAvailableEngine, match="alpha"):
        select_loading_path(pes, des, ALPHA, BETA)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2 * BETA), st.integers(0, 3 * ALPHA),
                          st.sampled_from([True, True, True, False])), min_size=1, max_size=8),
       st.lists(st.integers(1, 800), max_size=30))
def test_properties(specs: list[tuple[int, int, bool]], lengths: list[int]) -> None:
    engines = [pe(i, tok, rq, h) for i, (tok, rq, h) in enumerate(specs)]
    queue = reqs(*lengths)
    res = pe_fetch(queue, engines, ALPHA, BETA)
    n = len(res.assignments)
    # FIFO: the assigned requests are the queue's prefix, in order; the rest remain.
    assert [rid for rid, _ in res.assignments] == [r.request_id for r in queue[:n]]
    assert list(res.remaining) == queue[n:]
    # Replay: never an overloaded/unhealthy engine; always min tok in C2, else in C3.
    state = {e.engine_id: e.copy() for e in engines}
    for (rid, eid), r in zip(res.assignments, queue, strict=False):
        assert rid == r.request_id
        chosen = state[eid]
        assert chosen.healthy and chosen.tok <= BETA
        ok = [e for e in state.values() if e.healthy and e.tok <= BETA]
        c2 = [e for e in ok if e.read_q <= ALPHA]
        pool = c2 or ok
        assert chosen in pool
        assert chosen.tok == min(e.tok for e in pool)
        chosen.tok += r.length
        chosen.seq += 1
    assert {e.engine_id: (e.tok, e.seq) for e in res.engines} == {
        k: (v.tok, v.seq) for k, v in state.items()}
    if res.remaining:  # stopped early only because C2 and C3 were empty
        assert all(classify_pe(e, ALPHA, BETA) is PEClass.OVERLOADED for e in res.engines)


def test_fetch_reads_the_queue_lazily_and_reports_consumed() -> None:
    # An endless queue: the fetch must stop at the first request no engine can take.
    def endless():  # type: ignore[no-untyped-def]
        i = 0
        while True:
            yield Request(i, 400)
            i += 1

    res = pe_fetch(endless(), [pe(0), pe(1)], ALPHA, BETA)
    # each engine takes requests while tok <= beta: 0, 400, 800 -> three each
    assert res.consumed == len(res.assignments) == 6
    assert res.stop_reason == "all_overloaded"
    queue = reqs(400, 400, 400, 400, 400, 400, 400, 400)
    res = pe_fetch(queue, [pe(0), pe(1)], ALPHA, BETA)
    assert res.consumed == 6 and list(res.remaining) == queue[6:]
