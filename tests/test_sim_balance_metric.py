"""The simulator's storage-NIC balance metric averages loaded time bins only (paper 7.5)."""

from __future__ import annotations

import math

import pytest

from dualpath_cli.sim.metrics import max_over_avg


def test_underloaded_bins_are_left_out() -> None:
    # bin 0: one node reads a little (underloaded, 1/3 of capacity 30); bin 1: even and busy
    bins = [{0: 10.0, 1: 10.0}, {0: 0.0, 1: 10.0}, {1: 10.0}]
    ratio, used = max_over_avg(bins, capacity=30.0)
    assert used == 1 and ratio == pytest.approx(1.0)


def test_all_bins_with_traffic_count_when_none_is_loaded() -> None:
    bins = [{0: 4.0, 1: 2.0}, {1: 2.0}]
    ratio, used = max_over_avg(bins, capacity=100.0)
    # bin 0: max 4 / avg 2 = 2.0; bin 1: max 2 / avg 2 = 1.0
    assert used == 2 and ratio == pytest.approx(1.5)


def test_nothing_read_is_nan() -> None:
    ratio, used = max_over_avg([{}, {}], capacity=10.0)
    assert math.isnan(ratio) and used == 0


def test_imbalance_in_loaded_bins_is_reported() -> None:
    bins = [{0: 30.0}, {0: 10.0}, {0: 5.0}]
    ratio, used = max_over_avg(bins, capacity=60.0)
    assert used == 1 and ratio == pytest.approx(30.0 / 15.0)


def test_dualpath_balances_storage_nics_better_than_round_robin() -> None:
    """Paper Figure 13's comparison on three machines (DS 27B 1P2D), small and I/O-bound."""
    from dualpath_cli.sim.api import make_setup, simulate_offline
    from dualpath_cli.sim.trace import synthetic_plans

    plans = synthetic_plans(64_000, 128, 1)
    rr = simulate_offline(make_setup("ds27b", "1P2D", "round-robin"), plans)
    dp = simulate_offline(make_setup("ds27b", "1P2D", "dualpath"), plans)
    assert rr.snic_max_avg == pytest.approx(1.5, abs=0.05)  # PE node reads half: 0.5 / (1/3)
    assert dp.snic_max_avg < rr.snic_max_avg - 0.15
    assert dp.extra["snic_max_avg_bins"] >= 1
