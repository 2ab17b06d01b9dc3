"""The synthetic generator reproduces Table 2 (checklist A3) with negatively correlated turns."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath_cli.errors import UsageError
from dualpath_cli.workload.stats import trace_stats
from dualpath_cli.workload.synthetic import calibrate, generate
from dualpath_cli.workload.table2 import TABLE2, Table2Row, dispersion, targets_for

COLUMNS = ("turns", "append", "gen", "total", "context")


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("row", TABLE2, ids=lambda r: f"{r.max_len // 1000}K")
def test_table2_means_within_5_percent(row: Table2Row, seed: int) -> None:
    trajs = generate(row.max_len, 500, seed)
    stats = trace_stats(trajs).to_dict()
    assert stats["agents"] == 500
    for key in COLUMNS:
        want = getattr(row, key)
        assert abs(stats[key] / want - 1) <= 0.05, (key, stats[key], want)
    assert max(t.total for t in trajs) <= row.max_len
    assert stats["max_total"] <= row.max_len


@pytest.mark.parametrize("row", TABLE2, ids=lambda r: f"{r.max_len // 1000}K")
def test_turn_count_and_size_negatively_correlated(row: Table2Row) -> None:
    stats = trace_stats(generate(row.max_len, 500, 11))
    assert stats.turn_size_corr < -0.4
    assert stats.turn_size_rank_corr < -0.8
    # the table's Turns x (Append + Gen) > Total only holds with that correlation
    assert stats.dispersion == pytest.approx(dispersion(row), rel=0.05)
    assert stats.dispersion > 1.5


def test_independent_draws_would_not_fit_table2() -> None:
    """Control: pairing each turn count with a random other trajectory's size breaks Total."""
    row = TABLE2[2]
    trajs = generate(row.max_len, 500, 5)
    n = np.array([t.num_turns for t in trajs], dtype=float)
    size = np.array([t.total / t.num_turns for t in trajs])
    shuffled = n * np.random.default_rng(0).permutation(size)
    assert shuffled.mean() > 1.3 * row.total  # independent: totals blow far past Table 2
    assert (shuffled > row.max_len).mean() > 0.1


def test_same_seed_same_trace_and_different_seed_differs() -> None:
    a, b, c = (generate(32_000, 50, s) for s in (4, 4, 5))
    assert a == b
    assert a != c
    assert len({t.token_seed for t in a}) == 50


def test_calibration_reproduces_targets_in_expectation() -> None:
    params = calibrate(TABLE2[1])
    assert params.total_fraction == pytest.approx(42_607 / 48_000)
    assert params.gen_fraction == pytest.approx(172 / (474 + 172))
    assert 0 < params.prompt_share < 1
    assert params.turns_sigma > 0.5  # a wide turn-count spread is what Table 2 needs


def test_targets_interpolate_between_rows() -> None:
    assert targets_for(64_000) == TABLE2[2]
    mid = targets_for(40_000)
    assert TABLE2[0].turns < mid.turns < TABLE2[1].turns
    assert mid.append == pytest.approx((608 + 474) / 2)
    big = targets_for(128_000)
    assert big.append == 429 and big.turns == pytest.approx(2 * 157, rel=0.01)
    with pytest.raises(UsageError):
        targets_for(100)


@pytest.mark.parametrize("max_len", [8_000, 40_000, 128_000])
def test_other_max_lengths_track_their_targets(max_len: int) -> None:
    stats = trace_stats(generate(max_len, 500, 2))
    target = targets_for(max_len)
    for key in COLUMNS:
        assert abs(getattr(stats, key) / getattr(target, key) - 1) <= 0.05, key
    assert stats.max_total <= max_len


@settings(max_examples=25, deadline=None)
@given(st.integers(256, 300_000), st.integers(1, 30), st.integers(0, 2**32))
def test_every_trace_respects_the_cap(max_len: int, agents: int, seed: int) -> None:
    trajs = generate(max_len, agents, seed)
    assert len(trajs) == agents
    assert [t.agent_id for t in trajs] == list(range(agents))
    for t in trajs:
        assert t.total <= max_len
        assert t.num_turns >= 2
        assert all(turn.append >= 1 and turn.gen >= 1 for turn in t.turns)


@pytest.mark.parametrize("args", [(32_000, 0, 1), (32_000, 5, -1), (100, 5, 1)])
def test_bad_arguments(args: tuple[int, int, int]) -> None:
    with pytest.raises(UsageError):
        generate(*args)
