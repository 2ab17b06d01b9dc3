"""The scheduler's loop handles what is waiting in one pass (``scheduler.batch_window``):
one blocking receive starts a batch, the rest are taken without waiting, and a full batch
is followed by the next without the wait."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from dualpath_cli.core.layout import BlockShape, Namespace
from dualpath_cli.core.policies import SchedParams
from dualpath_cli.errors import UsageError
from dualpath_cli.runtime import sched_loop
from dualpath_cli.runtime.scheduler import SchedulerService
from dualpath_cli.runtime.wire import Heartbeat, Hello, encode
from dualpath_cli.storage import MemoryStore
from dualpath_cli.transfer import InProcFabric

_NS = Namespace("tiny", "layer_major", BlockShape(2, 8, 8))
_PARAMS = SchedParams(alpha=10**9, beta=10**9, z_factor=1.05, block_tokens=8)


def _batches(window: float, beats: int) -> tuple[list[int], SchedulerService]:
    """Queue a hello and ``beats`` heartbeats before the loop starts; the number of
    messages each batch (from one blocking receive to the next) handled."""
    fabric = InProcFabric()
    sched = SchedulerService(fabric, MemoryStore(), _NS, "dualpath", _PARAMS, 4096 * 8,
                             batch_window_s=window)
    sched.register(0, "prefill", 0, 0)
    ep = fabric.endpoint("engine0")
    for msg in [Hello(0, ep.address, "prefill", 0, 0, 0)] + [
            Heartbeat(eid=0, n=i + 1, seen=0, rq=i) for i in range(beats)]:
        header, frames = encode(msg)
        ep.send(sched.address, header, frames)
    batches: list[int] = []
    recv, handle = sched.ep.recv, sched.on_message
    all_handled = threading.Event()

    def counted_recv(timeout: float | None = None) -> Any:
        if timeout != 0:  # a blocking receive: a batch starts
            batches.append(0)
        return recv(timeout)

    def counted_handle(raw: Any) -> None:
        batches[-1] += 1
        handle(raw)
        if sum(batches) == beats + 1:
            all_handled.set()

    sched.ep.recv = counted_recv  # type: ignore[method-assign]
    sched.on_message = counted_handle
    sched.start()
    try:
        assert all_handled.wait(30), f"handled {sum(batches)} of {beats + 1}"
    finally:
        sched.stop()
    return [b for b in batches if b], sched


def test_what_is_waiting_is_handled_in_one_batch() -> None:
    batches, sched = _batches(0.002, 20)
    assert batches == [21]
    assert sched.engines[0].rq == 19  # every heartbeat taken, in order


def test_without_a_window_each_message_is_its_own_batch() -> None:
    batches, sched = _batches(0.0, 5)
    assert batches == [1] * 6
    assert sched.engines[0].rq == 4


def test_a_batch_holds_at_most_the_cap_and_the_rest_come_next() -> None:
    cap = sched_loop.BATCH_MAX
    batches, _ = _batches(0.002, cap + 10)
    assert batches == [cap, 11]


def test_a_negative_window_is_refused() -> None:
    with pytest.raises(UsageError, match="batch window"):
        SchedulerService(InProcFabric(), MemoryStore(), _NS, "dualpath", _PARAMS, 4096 * 8,
                         batch_window_s=-0.001)
