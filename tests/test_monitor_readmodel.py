"""The engine compute window (runtime/readmodel.py): what the view's GPU utilisation,
service time and KV wait mean, from heartbeats alone (no cluster)."""

from __future__ import annotations

import pytest

from dualpath_cli.runtime.readmodel import EngineWindow, engine_view
from dualpath_cli.runtime.wire import Heartbeat


def hb(n: int, busy: float, items: int, wait: float = 0.0, waits: int = 0) -> Heartbeat:
    return Heartbeat(0, n, -1, 0, busy_s=busy, batched_items=items, kv_wait_s=wait,
                     kv_waits=waits)


def test_utilization_is_over_the_last_window_not_since_start() -> None:
    w = EngineWindow(window_s=1.0)
    w.update(0.0, hb(1, 0.0, 0))
    w.update(0.5, hb(2, 0.5, 10))
    assert w.utilization is None  # no whole window yet
    w.update(1.0, hb(3, 1.0, 20))  # busy the whole first second
    assert w.utilization == pytest.approx(1.0) and w.service_time_s == pytest.approx(0.05)
    w.update(2.0, hb(4, 1.0, 20))  # idle the next: since start would say 0.5
    assert w.utilization == 0.0 and w.service_time_s is None


def test_kv_wait_is_the_mean_over_the_windows_prefills() -> None:
    w = EngineWindow(window_s=1.0)
    w.update(0.0, hb(1, 0.0, 0))
    w.update(1.2, hb(2, 0.6, 3, wait=0.3, waits=3))
    assert w.kv_wait_s == pytest.approx(0.1) and w.utilization == pytest.approx(0.5)
    view = engine_view(0, "prefill", 0, 0, "ready", None, 0, 0, 0, hb(2, 0.6, 3), 0.0, w)
    assert view.kv_wait_s == pytest.approx(0.1) and view.service_time_s == pytest.approx(0.2)
    w.update(2.4, hb(3, 0.6, 3, wait=0.3, waits=3))
    assert w.kv_wait_s is None  # no prefill in that window


def test_a_restarted_engine_starts_a_new_window() -> None:
    w = EngineWindow(window_s=1.0)
    w.update(0.0, hb(1, 5.0, 100))
    w.update(1.0, hb(2, 0.1, 1))  # counters went back: a new process
    assert w.utilization is None
    w.update(2.0, hb(3, 0.6, 3))
    assert w.utilization == pytest.approx(0.5)


def test_a_batch_longer_than_the_window_reads_busy_in_every_window_it_spans() -> None:
    """Busy time arrives when a batch ends: a 3 s prefill batch is busy for 3 windows, not
    idle, idle, then saturated."""
    w = EngineWindow(window_s=1.0)
    w.update(0.0, hb(1, 0.0, 0))
    w.update(1.0, hb(2, 0.0, 0))
    w.update(2.0, hb(3, 0.0, 0))
    w.update(3.0, hb(4, 3.0, 1))  # the batch that ran from 0 to 3 s ends
    assert w.utilization == 1.0 and w.service_time_s == pytest.approx(3.0)
    w.update(4.0, hb(5, 3.0, 1))  # nothing new ended: the carried 2 s keep it busy
    assert w.utilization == 1.0
    w.update(5.0, hb(6, 3.0, 1))
    assert w.utilization == 1.0
    w.update(6.0, hb(7, 3.0, 1))  # the carry is spent: idle
    assert w.utilization == 0.0
