"""Max/Avg balance: 1.0 when even, node count when one node does everything, NaN when idle."""

import math

from dualpath_cli.core.balance import max_over_avg


def test_even_load_is_one() -> None:
    assert max_over_avg([5.0, 5.0, 5.0]) == 1.0


def test_one_busy_node_of_three_is_three() -> None:
    assert max_over_avg([9.0, 0.0, 0.0]) == 3.0


def test_idle_or_empty_is_nan() -> None:
    assert math.isnan(max_over_avg([0.0, 0.0]))
    assert math.isnan(max_over_avg([]))
