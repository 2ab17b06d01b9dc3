"""A turn answered 503 after ``scheduler.no_engine_wait`` (no serving decode or prefill
engine) is taken out of the scheduler's queues too (issue 32 item 2): it must not run
later, for nobody, once the role comes back, nor keep the queue long.

Quick: a live cluster that is not spawned (no thread, no process), joined nodes that never
said hello (so no role serves), and one pass of the watcher that answers waiting turns."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.services.live import EnginesLost, LiveCluster


def test_a_turn_answered_503_leaves_the_scheduler_queue(tmp_path: Path) -> None:
    live = LiveCluster(RuntimeOptions(local_engines=False, store_dir=tmp_path / "store"))
    try:
        assert live.joins is not None
        live.joins.join("P0", "prefill", 1)
        live.joins.join("D0", "decode", 1)
        live.state = "ready"  # admitting (its engines never say hello here)
        live.no_engine_wait_s = 3600.0  # the role has not been missing that long yet
        tickets = [live.submit([1, 2, 3, 4], 2) for _ in range(3)]
        sched = live.system.scheduler
        assert len(sched.queue) == 3 and len(sched.flights) == 3
        live._answer_role_waiters()  # the wait has not passed: nothing is answered
        assert not any(t.event.is_set() for t in tickets)

        live.no_engine_wait_s = 0.0  # now it has
        live._answer_role_waiters()
        for ticket in tickets:
            with pytest.raises(EnginesLost, match="scheduler.no_engine_wait"):
                ticket.wait(0)
        # out of every queue: nothing left to dispatch when the role comes back
        assert len(sched.queue) == 0 and len(sched.pe_queue) == 0
        assert not sched.flights
        assert live.in_flight() == 0
        # and the counter of turns their caller gave up is not touched: no caller did
        assert sched.registry.counter("dualpath_scheduler_cancelled_turns_total").value == 0
    finally:
        live.close()
