"""Compute-quota batching (paper 6.5) with the bsz binary search and chunked remainders."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath_cli.core.profiles import MODEL_PROFILES
from dualpath_cli.core.quota import (
    PrefillWork,
    flops_predictor,
    largest_fitting_bsz,
    pack_batch,
)


def linear(cached: int, bsz: int) -> float:
    return float(bsz)


def test_hand_worked_pack_and_chunk() -> None:
    queue = [PrefillWork(1, 0, 4), PrefillWork(2, 0, 5), PrefillWork(3, 0, 3)]
    b = pack_batch(queue, 10.0, linear)
    # 4 + 5 = 9 fits; request 3 needs 3 but only 1 is left: a chunk of 1, remainder (1, 2).
    assert b.items == (PrefillWork(1, 0, 4), PrefillWork(2, 0, 5), PrefillWork(3, 0, 1))
    assert b.predicted == 10.0 and not b.over_quota
    assert b.remaining == (PrefillWork(3, 1, 2),)
    b2 = pack_batch(b.remaining, 10.0, linear)
    assert b2.items == (PrefillWork(3, 1, 2),) and b2.remaining == ()


def test_no_room_closes_batch_without_chunk() -> None:
    queue = [PrefillWork(1, 0, 10), PrefillWork(2, 0, 5)]
    b = pack_batch(queue, 10.0, linear)
    assert b.items == (PrefillWork(1, 0, 10),) and b.remaining == (PrefillWork(2, 0, 5),)


def test_single_token_over_quota_rule() -> None:
    def huge(cached: int, bsz: int) -> float:
        return 100.0 * bsz

    b = pack_batch([PrefillWork(7, 30, 3), PrefillWork(8, 0, 1)], 10.0, huge)
    assert b.over_quota and b.items == (PrefillWork(7, 30, 1),)
    assert b.remaining == (PrefillWork(7, 31, 2), PrefillWork(8, 0, 1))


def test_flops_predictor_uses_profile() -> None:
    m = MODEL_PROFILES["ds660b"]
    p = flops_predictor(m, 1e15)
    assert p(32_000, 430) == pytest.approx(m.attention_flops(32_000, 430) / 1e15)
    with pytest.raises(ValueError):
        flops_predictor(m, 0)


def test_seed_off_by_one_is_fixed() -> None:
    # the seed's loop returns the first bsz that does NOT fit; ours returns the last that does
    assert largest_fitting_bsz(linear, 0, 100, 37.0) == 37
    assert largest_fitting_bsz(linear, 0, 100, 0.5) == 0
    assert largest_fitting_bsz(linear, 0, 100, 1e9) == 100


def test_bad_work_and_quota() -> None:
    with pytest.raises(ValueError, match="request 3"):
        PrefillWork(3, 0, 0)
    with pytest.raises(ValueError):
        pack_batch([], 0.0, linear)


coef = st.floats(0.0, 1e-3, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(coef, coef, st.integers(0, 100_000), st.integers(1, 50_000), st.floats(1e-6, 50.0))
def test_binary_search_largest(a: float, q: float, cached: int, bsz: int,
                               budget: float) -> None:
    def predict(c: int, b: int) -> float:
        return a * b + q * b * (2 * c + b) * 1e-3

    b = largest_fitting_bsz(predict, cached, bsz, budget)
    assert 0 <= b <= bsz
    if b > 0:
        assert predict(cached, b) <= budget
    if b < bsz:
        assert predict(cached, b + 1) > budget


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60_000), st.integers(1, 4_000)), max_size=12),
       st.floats(0.001, 0.5))
def test_pack_properties(work: list[tuple[int, int]], quota: float) -> None:
    predict = flops_predictor(MODEL_PROFILES["ds660b"], 4e14)
    queue: tuple[PrefillWork, ...] = tuple(PrefillWork(i, c, b) for i, (c, b) in
                                           enumerate(work))
    done: dict[int, list[PrefillWork]] = {}
    order: list[int] = []
    for _ in range(100_000):
        if not queue:
            break
        b = pack_batch(queue, quota, predict)
        assert b.items, "every batch makes progress"
        assert b.predicted == pytest.approx(sum(predict(w.cached, w.bsz) for w in b.items))
        if b.over_quota:
            assert len(b.items) == 1 and b.items[0].bsz == 1
            assert predict(b.items[0].cached, 1) > quota
        else:
            assert b.predicted <= quota
        for w in b.items:
            done.setdefault(w.request_id, []).append(w)
            if not order or order[-1] != w.request_id:
                order.append(w.request_id)
        queue = b.remaining
    assert not queue
    assert order == list(range(len(work)))  # FIFO, each request finished before the next
    for rid, (cached, bsz) in enumerate(work):
        chunks = done[rid]
        assert sum(w.bsz for w in chunks) == bsz
        c = cached
        for w in chunks:  # remainders carry over with cached updated by bsz'
            assert w.cached == c
            c += w.bsz


def test_pack_reads_lazily_and_reports_consumed_and_carry() -> None:
    def endless():  # type: ignore[no-untyped-def]
        i = 0
        while True:
            yield PrefillWork(i, 0, 4)
            i += 1

    b = pack_batch(endless(), 10.0, linear)  # 4 + 4 + a chunk of 2
    assert b.consumed == 3 and b.carry == PrefillWork(2, 2, 2)
    assert [w.bsz for w in b.items] == [4, 4, 2]
    queue = [PrefillWork(1, 0, 4), PrefillWork(2, 0, 4), PrefillWork(3, 0, 4)]
    whole = pack_batch(queue, 8.0, linear)  # two whole items exactly fill the quota
    assert (whole.consumed, whole.carry, whole.remaining) == (2, None, (queue[2],))
