"""Read-side choice (paper 6.4) and the split read."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath_cli.core.read_side import choose_read_side, split_read
from dualpath_cli.core.types import ReadSide


def test_shorter_queue_and_tie_to_pe() -> None:
    assert choose_read_side(10, 5) is ReadSide.DE
    assert choose_read_side(5, 10) is ReadSide.PE
    # ties (typically both queues empty) go to the PE side: one hop fewer before prefill
    assert choose_read_side(7, 7) is ReadSide.PE
    assert choose_read_side(0, 0) is ReadSide.PE


def test_split_hand_worked() -> None:
    # 640 cached tokens = 10 blocks; DE already has 128 queued: PE takes 6 blocks, DE 4,
    # both queues then hold 384 tokens.
    s = split_read(640, 0, 128)
    assert (s.pe_blocks, s.de_blocks) == (range(0, 6), range(6, 10))
    assert (s.pe_tokens, s.de_tokens, s.pe_drain, s.de_drain) == (384, 256, 384.0, 384.0)


def test_split_rates_and_extremes() -> None:
    s = split_read(640, 0, 0, pe_rate=3.0, de_rate=1.0)  # x = 480 tokens
    assert s.pe_tokens == 448 or s.pe_tokens == 512
    assert split_read(640, 0, 10_000).de_tokens == 0  # DE far behind: PE reads all
    assert split_read(640, 10_000, 0).pe_tokens == 0
    assert split_read(0, 5, 5).pe_blocks == range(0) == split_read(0, 5, 5).de_blocks
    partial = split_read(100, 0, 0)  # blocks of 64 and 36 tokens
    assert partial.pe_tokens + partial.de_tokens == 100


@pytest.mark.parametrize("kwargs", [{"block_tokens": 0}, {"pe_rate": 0.0}])
def test_split_rejects_bad_input(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        split_read(64, 0, 0, **kwargs)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 20_000), st.integers(0, 20_000), st.integers(0, 20_000),
       st.sampled_from([1, 16, 64, 512]), st.floats(0.1, 10.0), st.floats(0.1, 10.0))
def test_split_covers_every_block_once_and_is_optimal(cached: int, pq: int, dq: int,
                                                     block: int, pr: float,
                                                     dr: float) -> None:
    s = split_read(cached, pq, dq, pe_rate=pr, de_rate=dr, block_tokens=block)
    n = math.ceil(cached / block)
    blocks = list(s.pe_blocks) + list(s.de_blocks)
    assert sorted(blocks) == list(range(n)) and len(set(blocks)) == n
    assert s.pe_tokens + s.de_tokens == cached
    size = [min(block, cached - i * block) for i in range(n)]
    assert s.pe_tokens == sum(size[i] for i in s.pe_blocks)
    # the cut minimises the later drain over every possible cut
    best = min(max((pq + min(k * block, cached)) / pr, (dq + cached - min(k * block, cached)) / dr)
               for k in range(n + 1))
    assert max(s.pe_drain, s.de_drain) <= best * (1 + 1e-12)
