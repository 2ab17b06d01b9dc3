"""DE two-phase scheduling (paper 6.3): phase 1 across groups, phase 2 inside a group."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath_cli.core.de_schedule import (
    GroupLoads,
    de_place,
    de_route,
    group_load,
    hbm_bounded_count,
    pick_de,
    z_threshold,
)
from dualpath_cli.core.types import EngineSnapshot, Request, Role


def de(eid: int, tok: int = 0, seq: int = 0, hbm: int = 10_000,
       healthy: bool = True) -> EngineSnapshot:
    return EngineSnapshot(eid, node=1, group=1, role=Role.DECODE, seq=seq, tok=tok,
                          hbm_free=hbm, healthy=healthy)


def reqs(*lengths: int) -> list[Request]:
    return [Request(i, n) for i, n in enumerate(lengths)]


# ---- phase 1 ---------------------------------------------------------------------------

def test_route_min_total_and_updates_after_each() -> None:
    res = de_route(reqs(100, 100, 50, 300), {0: 0, 1: 120, 2: 60})
    # 0:0 -> 100; then min is 2 (60) -> 160; then 0 (100) -> 150; then 1 (120) -> 420
    assert res.assignments == ((0, 0), (1, 2), (2, 0), (3, 1))
    assert res.loads.as_dict() == {0: 150, 1: 420, 2: 160}


def test_route_does_not_modify_input_loads() -> None:
    loads = GroupLoads({0: 5, 1: 5})
    de_route(reqs(10), loads)
    assert loads.as_dict() == {0: 5, 1: 5}


def test_group_loads_set_and_ties() -> None:
    g = GroupLoads({3: 10, 1: 10, 2: 11})
    assert g.min_group() == 1  # tie -> lower id
    g.set(1, 50)
    assert g.min_group() == 3
    for _ in range(200):  # lazy heap stays bounded and correct under churn
        g.add(2, 1)
        g.add(2, -1)
    assert g.min_group() == 3 and len(g._heap) <= 2 * len(g) + 16
    assert group_load([de(0, tok=7), de(1, tok=3)], reqs(5)) == 15


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 40), st.integers(0, 10_000),
       st.lists(st.integers(1, 64_000), max_size=200))
def test_route_balanced_within_one_request(groups: int, start: int,
                                           lengths: list[int]) -> None:
    res = de_route(reqs(*lengths), {g: start for g in range(groups)})
    loads = res.loads.as_dict().values()
    assert max(loads) - min(loads) <= max(lengths, default=0)
    assert [rid for rid, _ in res.assignments] == list(range(len(lengths)))
    assert sum(loads) == groups * start + sum(lengths)


# ---- phase 2 ---------------------------------------------------------------------------

def test_hand_worked_place() -> None:
    engines = [de(0, tok=1000, seq=2, hbm=2000), de(1, tok=0, seq=0, hbm=500)]
    queue = reqs(400, 400, 1600, 100, 50)
    res = de_place(queue, engines)
    # total HBM 2500: R = first four (2500); the fifth would need 2550.
    assert res.r_count == 4
    assert res.z == pytest.approx(1.05 * (2500 + 1000) / 2)  # 1837.5
    # r0: both normal -> min seq -> d1.  r1: d1 lacks HBM -> d0 (1400 <= Z, normal).
    # r2 (1600): only d0 has HBM, 3000 > Z -> high-token d0.  r3: d1 (100 HBM left), normal.
    # r4: no DE has 50 tokens of HBM -> stop.
    assert res.assignments == ((0, 1), (1, 0), (2, 0), (3, 1))
    assert res.stop_reason == "no_hbm"
    assert [r.request_id for r in res.remaining] == [4]
    d0, d1 = res.engines
    assert (d0.tok, d0.seq, d0.hbm_free) == (3000, 4, 0)
    assert (d1.tok, d1.seq, d1.hbm_free) == (500, 2, 0)
    assert engines[0].tok == 1000  # input untouched


def test_normal_prefers_min_seq_over_min_tok() -> None:
    engines = [de(0, tok=500, seq=1), de(1, tok=100, seq=3)]
    chosen = pick_de(engines, 10, z=10_000)
    assert chosen is not None and chosen.engine_id == 0


def test_high_token_picks_min_tok() -> None:
    engines = [de(0, tok=900, seq=0), de(1, tok=800, seq=9)]
    chosen = pick_de(engines, 100, z=850)
    assert chosen is not None and chosen.engine_id == 1  # both high -> min tok
    assert pick_de([de(0, hbm=10)], 11, z=1e9) is None


def test_unhealthy_group() -> None:
    res = de_place(reqs(1), [de(0, healthy=False)])
    assert res.assignments == () and res.stop_reason == "no_engines"


def test_z_threshold_formula() -> None:
    assert z_threshold(300, [de(0, tok=100), de(1, tok=200)], 1.0) == 300.0
    with pytest.raises(ValueError):
        z_threshold(1, [])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50_000), st.integers(0, 20),
                          st.integers(0, 120_000), st.sampled_from([True, True, True, False])),
                min_size=1, max_size=8),
       st.lists(st.integers(1, 40_000), max_size=25),
       st.sampled_from([1.0, 1.05, 1.2]))
def test_place_properties(specs: list[tuple[int, int, int, bool]], lengths: list[int],
                          zf: float) -> None:
    engines = [de(i, tok, seq, hbm, h) for i, (tok, seq, hbm, h) in enumerate(specs)]
    queue = reqs(*lengths)
    res = de_place(queue, engines, zf)
    live = [e for e in engines if e.healthy]
    n = len(res.assignments)
    # FIFO prefix
    assert [rid for rid, _ in res.assignments] == list(range(n))
    assert list(res.remaining) == queue[n:]
    if not live:
        assert n == 0
        return
    # R is the longest head that fits the total free HBM; Z is exact.
    total = sum(e.hbm_free for e in live)
    k = res.r_count
    assert sum(lengths[:k]) <= total
    assert k == len(lengths) or sum(lengths[:k + 1]) > total
    exact = Fraction(zf) * (sum(lengths[:k]) + sum(e.tok for e in live)) / len(live)
    assert abs(Fraction(res.z) - exact) <= exact * Fraction(1, 10**12)
    # Replay every choice: enough HBM, unhealthy never, normal-by-seq else high-by-tok.
    state = {e.engine_id: e.copy() for e in engines}
    for rid, eid in res.assignments:
        length = lengths[rid]
        chosen = state[eid]
        assert chosen.healthy and chosen.hbm_free >= length
        fit = [e for e in state.values() if e.healthy and e.hbm_free >= length]
        normal = [e for e in fit if e.tok + length <= res.z]
        if normal:
            assert chosen in normal and chosen.seq == min(e.seq for e in normal)
        else:
            assert chosen.tok == min(e.tok for e in fit)
        chosen.tok += length
        chosen.seq += 1
        chosen.hbm_free -= length
    assert all(e.hbm_free >= 0 for e in res.engines)
    assert n <= k  # never more than the HBM bound allows
    if res.remaining:  # stopped because no DE had the HBM for the head
        head = res.remaining[0].length
        assert res.stop_reason == "no_hbm"
        assert all(e.hbm_free < head for e in res.engines if e.healthy)


def test_hbm_bounded_count() -> None:
    assert hbm_bounded_count(reqs(5, 5, 5), 10) == 2
    assert hbm_bounded_count(reqs(11), 10) == 0
