"""The supervisor's restart rule (core/restart_policy.py), as a pure function: backoff 0.5 s
doubling to 30 s, afresh after 60 s of service, five deaths in 60 s a crash loop."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath_cli.core.restart_policy import EngineRecord, RestartPolicy, decide_restart

POLICY = RestartPolicy()


def _die_every(gap_s: float, deaths: int) -> list[float]:
    """The delays decided for ``deaths`` deaths ``gap_s`` apart (each after a restart)."""
    rec, now, delays = EngineRecord(started_at=1.0), 1.0, []
    for _ in range(deaths):
        now += gap_s
        d = decide_restart(POLICY, rec, now)
        if not d.restart:
            delays.append(-1.0)
            break
        delays.append(d.delay_s)
        rec = EngineRecord(d.record.deaths, d.record.streak, now + d.delay_s)
    return delays


def test_backoff_doubles_from_half_a_second() -> None:
    assert _die_every(20.0, 4) == [0.5, 1.0, 2.0, 4.0]


def test_the_fifth_death_within_a_minute_is_a_crash_loop() -> None:
    assert _die_every(1.0, 6) == [0.5, 1.0, 2.0, 4.0, -1.0]


def test_an_engine_that_served_a_minute_starts_the_backoff_afresh() -> None:
    assert _die_every(61.0, 8) == [0.5] * 8  # never a crash loop: deaths a minute apart


def test_the_backoff_stops_at_thirty_seconds() -> None:
    assert [POLICY.delay(n) for n in (5, 6, 7, 100, 10**6)] == [16.0, 30.0, 30.0, 30.0, 30.0]


def test_bad_numbers_are_refused() -> None:
    with pytest.raises(ValueError, match="base"):
        RestartPolicy(base_s=0.0)
    with pytest.raises(ValueError, match="loop_deaths"):
        RestartPolicy(loop_deaths=0)


@given(st.lists(st.floats(min_value=0.0, max_value=200.0), min_size=1, max_size=30),
       st.floats(min_value=0.001, max_value=30.0))
def test_delays_stay_in_bounds_and_a_loop_needs_five_recent_deaths(
        gaps: list[float], base: float) -> None:
    policy = RestartPolicy(base_s=base, cap_s=max(base, 30.0))
    rec, now = EngineRecord(started_at=1.0), 1.0
    for gap in gaps:
        now += gap
        d = decide_restart(policy, rec, now)
        recent = [t for t in d.record.deaths if now - t < policy.loop_window_s]
        assert len(recent) == d.recent_deaths <= policy.loop_deaths
        if d.crash_loop:
            assert d.recent_deaths == policy.loop_deaths
            return
        assert base <= d.delay_s <= policy.cap_s
        rec = EngineRecord(d.record.deaths, d.record.streak, now + d.delay_s)
        now += d.delay_s
