"""The TTFT breakdown `explain` prints sums to the TTFT, whichever of compute and the first
layer's KV came first (layerwise prefill may start computing before layer 0 is loaded: that
wait is compute's bubble, and counted once)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath_cli.diagnose.explain import _split

gap = st.floats(min_value=0.0, max_value=5.0, allow_nan=False)


@given(gap, gap, gap, gap, gap, gap)
def test_the_parts_sum_to_the_ttft(queued: float, to_arrive: float, to_compute: float,
                                   ready_after_arrival: float, bubble_extra: float,
                                   compute_s: float) -> None:
    sub = 100.0
    disp = sub + queued
    arrived = disp + to_arrive
    compute = arrived + to_compute
    ready = arrived + ready_after_arrival
    # compute waits for layer 0 when it started before it was loaded: part of the bubble
    wait0 = max(0.0, ready - compute)
    bubble = wait0 + bubble_extra
    first = compute + bubble + compute_s
    outcome = {"submitted": sub, "dispatched": disp, "first_at": first,
               "pe": {"arrived": arrived, "kv_ready": ready, "compute": compute,
                      "kv_bubble_s": bubble}}
    parts = _split(outcome)
    assert all(v is not None and v >= 0.0 for v in parts.values()), parts
    assert sum(v for v in parts.values() if v is not None) == \
        pytest.approx(first - sub, abs=1e-9)


def test_layer_zero_loaded_after_compute_started_is_not_loading_twice() -> None:
    """The CI case: compute at 10 ms, layer 0 in HBM at 14 ms (4 ms of bubble)."""
    outcome = {"submitted": 0.0, "dispatched": 0.002, "first_at": 0.045,
               "pe": {"arrived": 0.003, "kv_ready": 0.014, "compute": 0.010,
                      "kv_bubble_s": 0.004}}
    parts = _split(outcome)
    assert parts["loading_s"] == pytest.approx(0.008)
    assert parts["transfer_s"] == 0.004
    assert sum(v for v in parts.values() if v is not None) == \
        pytest.approx(0.045)


def test_missing_pe_facts_give_no_parts() -> None:
    assert set(_split({"submitted": 0.0}).values()) == {None}
