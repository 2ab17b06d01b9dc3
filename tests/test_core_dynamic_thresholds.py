"""The dynamic alpha (seed) and beta controllers."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath_cli.core.thresholds import dynamic_alpha, dynamic_beta, step_controller


def test_seed_rule_from_base() -> None:
    base = 8 * 1024
    assert dynamic_alpha(base, 0.85, lo=1, hi=1e9) == pytest.approx(base * 0.9)
    assert dynamic_alpha(base, 0.3, lo=1, hi=1e9) == pytest.approx(base * 1.1)
    assert dynamic_alpha(base, 0.8, lo=1, hi=1e9) == base  # 80% is not "above"
    assert dynamic_alpha(base, 0.5, lo=1, hi=1e9) == base  # 50% is not "below"


def test_beta_direction_and_bounds() -> None:
    assert dynamic_beta(16_000, 0.95, lo=8_000, hi=32_000) == pytest.approx(14_400)
    assert dynamic_beta(16_000, 0.2, lo=8_000, hi=32_000) == pytest.approx(17_600)
    assert dynamic_beta(31_000, 0.2, lo=8_000, hi=32_000) == 32_000
    assert dynamic_beta(8_100, 0.99, lo=8_000, hi=32_000) == 8_000


@pytest.mark.parametrize("util", [-0.1, math.nan])
def test_bad_utilisation(util: float) -> None:
    with pytest.raises(ValueError):
        dynamic_alpha(1.0, util, lo=0.5, hi=2.0)


def test_bad_bounds() -> None:
    with pytest.raises(ValueError):
        step_controller(1.0, 0.5, lo=2.0, hi=1.0, high_util=0.8, low_util=0.5)


@settings(max_examples=150, deadline=None)
@given(st.floats(1.0, 1e6), st.lists(st.floats(0.0, 1.5), max_size=60))
def test_stays_bounded(start: float, utils: list[float]) -> None:
    lo, hi = 10.0, 1e5
    v = start
    for u in utils:
        v = dynamic_alpha(v, u, lo=lo, hi=hi)
        assert lo <= v <= hi
        w = dynamic_beta(v, u, lo=lo, hi=hi)
        assert lo <= w <= hi
