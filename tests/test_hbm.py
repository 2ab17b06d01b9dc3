"""HBM paged allocator: no double allocation, fragmentation score, compaction."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath_cli.runtime.hbm import HbmExhausted, HbmPool, fragmentation_score


def test_allocate_free_and_stats() -> None:
    pool = HbmPool(10, 4, n_layers=2, bytes_per_token_layer=3)
    a = pool.allocate(1, 3)
    b = pool.allocate(2, 4)
    assert a == [0, 1, 2] and b == [3, 4, 5, 6]
    assert pool.stats().used_blocks == 7
    assert pool.free(1) == 3
    st_ = pool.stats()
    assert (st_.free_blocks, st_.largest_free_run) == (6, 3)
    assert st_.fragmentation == pytest.approx(0.5)
    assert pool.blocks_for_tokens(9) == 3


def test_exhaustion_allocates_nothing() -> None:
    pool = HbmPool(4, 2, with_data=False)
    pool.allocate(1, 3)
    with pytest.raises(HbmExhausted, match="need 2 blocks, 1 of 4 free"):
        pool.allocate(2, 2)
    assert pool.stats().used_blocks == 3


def test_compact_moves_data_and_zeroes_fragmentation() -> None:
    pool = HbmPool(8, 2, n_layers=2, bytes_per_token_layer=2)
    assert pool.data is not None
    for owner in range(4):
        for blk in pool.allocate(owner, 2):
            pool.data[blk] = owner * 10 + blk
    pool.free(0)
    pool.free(2)
    before = {o: pool.data[pool.blocks_of(o)].copy() for o in (1, 3)}
    assert pool.stats().fragmentation > 0
    moves = pool.compact()
    assert moves == {2: 0, 3: 1, 6: 2, 7: 3}
    assert pool.stats().fragmentation == 0.0
    assert pool.stats().largest_free_run == 4
    for o in (1, 3):
        np.testing.assert_array_equal(pool.data[pool.blocks_of(o)], before[o])


def test_fragmentation_score_edges() -> None:
    assert fragmentation_score(0, 0) == 0.0
    assert fragmentation_score(5, 5) == 0.0
    assert fragmentation_score(4, 1) == pytest.approx(0.75)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(1, 4)), max_size=40))
def test_no_block_is_ever_owned_twice(ops: list[tuple[bool, int, int]]) -> None:
    pool = HbmPool(16, 4, with_data=False)
    for alloc, owner, n in ops:
        if alloc:
            try:
                pool.allocate(owner, n)
            except HbmExhausted:
                pass
        else:
            pool.free(owner)
        if owner % 3 == 0:
            pool.compact()
        seen = [b for o in pool.owners() for b in pool.blocks_of(o)]
        assert len(seen) == len(set(seen))
        st_ = pool.stats()
        assert st_.used_blocks == len(seen)
        assert 0 <= st_.fragmentation < 1
