"""Hierarchical scheduling: core's partition and root routing, and the simulator's hierarchy."""

from __future__ import annotations

import pytest

from dualpath_cli.core.hierarchy import check_subs, default_subs, partition, route_to_subs
from dualpath_cli.core.types import Request
from dualpath_cli.errors import UsageError
from dualpath_cli.sim.api import make_setup, simulate_offline
from dualpath_cli.sim.hierarchy import HierarchicalSimulation, TimedSimulation
from dualpath_cli.sim.trace import synthetic_plans


def test_partition_is_contiguous_and_balanced() -> None:
    parts = partition(list(range(10)), 3)
    assert parts == [(0, 1, 2), (3, 4, 5), (6, 7, 8, 9)]
    assert partition([4, 5], 1) == [(4, 5)]
    with pytest.raises(UsageError):
        partition([1], 0)


def test_root_routes_to_the_least_loaded_sub_in_order() -> None:
    reqs = [Request(1, 100, 0), Request(2, 50, 0), Request(3, 10, 0)]
    res = route_to_subs(reqs, {0: 120, 1: 0, 2: 40})
    # 1 -> sub 1 (0), 2 -> sub 2 (40 < 100), 3 -> sub 2 (90 < 100)
    assert [sub for _, sub in res.assignments] == [1, 2, 2]


def test_sub_counts() -> None:
    assert default_subs(48, 96) == 12 and default_subs(480, 960) == 120
    assert default_subs(2, 4) == 1
    assert check_subs(3, 3, 6) == 3
    with pytest.raises(UsageError, match="need 1 to 3"):
        check_subs(4, 3, 6)


def test_one_sub_is_the_flat_scheduler_and_more_subs_keep_every_turn() -> None:
    setup = make_setup("ds27b", "4P8D")
    plans = synthetic_plans(16_000, 48, 1)
    flat = TimedSimulation(setup, plans)
    flat_res = flat.run_offline()
    one = HierarchicalSimulation(setup, plans, 1)
    assert one.run_offline().jct == flat_res.jct  # same core calls, same order
    four = HierarchicalSimulation(setup, plans, 4)
    assert four.run_offline().jct > 0
    assert four.turns_done == flat.turns_done == sum(p.num_turns for p in plans)
    assert all(n > 0 for n in four.sub_turns)  # the root spread the turns over every sub
    assert four.decision_ns and flat.decision_ns


def test_the_config_key_selects_the_hierarchy() -> None:
    setup = make_setup("ds27b", "8P16D", hierarchical=True)
    assert setup.sub_schedulers == 2
    res = simulate_offline(setup, synthetic_plans(16_000, 24, 2))
    assert res.jct > 0
