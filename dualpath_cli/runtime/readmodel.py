"""Pieces of the read model (:mod:`dualpath_cli.telemetry.view`) built from heartbeats.

Why apart from the scheduler: the scheduler holds the state (engines, queues, heartbeats)
and calls these pure functions under its lock; what an engine or a node looks like in a
:class:`~dualpath_cli.telemetry.view.ClusterView` is decided here, once. A value no heartbeat
has carried yet is ``None`` (not available), never 0 or NaN.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dualpath_cli.runtime.wire import TIERS, Heartbeat
from dualpath_cli.telemetry.view import EngineView, LayerHits, NodeView, na

__all__ = ["Rate", "EngineWindow", "engine_view", "node_view", "nic_bytes"]

_DRAM, _STORE, _PEER = (TIERS.index(t) for t in ("dram", "store", "peer"))


@dataclass
class Rate:
    """Bytes per second of a growing counter over the last window of at least ``window_s``.

    Why a window and not the last interval: heartbeats come every 50 ms and a counter moves
    in bursts (one read batch), so a per-heartbeat rate swings between 0 and the line rate.
    """

    window_s: float = 0.5
    t0: float | None = None
    v0: float = 0.0
    rate: float | None = None

    def update(self, now: float, value: float) -> None:
        """Feed the counter's value at ``now`` (monotonic seconds)."""
        if self.t0 is None or value < self.v0:  # first sample, or the counter restarted
            self.t0, self.v0 = now, value
            return
        if now - self.t0 >= self.window_s:
            self.rate = (value - self.v0) / (now - self.t0)
            self.t0, self.v0 = now, value


@dataclass
class EngineWindow:
    """An engine's compute over the last window of at least ``window_s`` of heartbeats:
    GPU busy fraction, busy seconds per batched request (its service time) and the mean
    wait of its prefills for their cached KV.

    Why windowed: "adding nodes does not help" and "one engine is slow" are judged on what
    the engines do now; a busy fraction since start hides a change under hours of history.
    A window in which the engine ran nothing has no service time (``None``), nor a KV wait
    when no prefill of a cached prefix was queued in it. Busy time is reported when a batch
    ends, so a batch longer than the window lands in one window; what exceeds that window
    is carried into the next ones (a prefill busy for 3 s reads busy for 3 windows, not
    idle, idle, saturated).
    """

    window_s: float = 1.0
    t0: float | None = None
    base: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    utilization: float | None = None
    service_time_s: float | None = None
    kv_wait_s: float | None = None
    carry_s: float = 0.0  # busy seconds reported beyond the windows they fell in

    def update(self, now: float, hb: Heartbeat) -> None:
        """Feed one heartbeat received at ``now`` (monotonic seconds)."""
        cur = (float(hb.busy_s), float(hb.batched_items), float(hb.kv_wait_s),
               float(hb.kv_waits))
        if self.t0 is None or cur[0] < self.base[0] or cur[1] < self.base[1]:
            self.t0, self.base = now, cur  # first heartbeat, or the engine restarted
            self.carry_s = 0.0
            return
        dt = now - self.t0
        if dt < self.window_s:
            return
        busy, items, wait, waits = (c - b for c, b in zip(cur, self.base, strict=True))
        self.service_time_s = busy / items if items > 0 else None
        busy += self.carry_s
        self.carry_s = max(0.0, busy - dt)
        self.utilization = min(1.0, max(0.0, busy / dt))
        self.kv_wait_s = wait / waits if waits > 0 else None
        self.t0, self.base = now, cur


def nic_bytes(hb: Heartbeat) -> dict[str, int]:
    """Bytes through an engine's NICs by ``<nic>_<direction>``."""
    return {"snic_read": int(hb.snic_read_bytes), "snic_write": int(hb.snic_write_bytes),
            "cnic_tx": int(hb.cnic_tx_bytes),
            "cnic_rx": int(hb.kv_rx_from_pe_bytes + hb.kv_rx_from_de_bytes)}


def _layers(hb: Heartbeat) -> tuple[LayerHits, ...]:
    if not any(any(row) for row in hb.layer_hits):
        return ()
    slack = hb.layer_slack_s
    return tuple(LayerHits(layer, row[_DRAM], row[_STORE], row[_PEER],
                           na(slack[layer]) if layer < len(slack) else None)
                 for layer, row in enumerate(hb.layer_hits))


def engine_view(engine_id: int, role: str, node: int, group: int, state: str,
                pid: int | None, seq: int, tokens: int, read_queue_tokens: int | None,
                hb: Heartbeat | None, heartbeat_age_s: float | None,
                window: EngineWindow | None = None) -> EngineView:
    """One engine: identity, load and the latest reported read queue (tokens) from the
    caller, the rest from its last heartbeat ``hb`` and its compute ``window`` (GPU
    utilisation, service time, KV wait; ``None`` until a window has passed)."""
    if hb is None:
        return EngineView(engine_id, role, node, group, state, pid, seq, tokens,
                          read_queue_tokens=read_queue_tokens,
                          heartbeat_age_s=heartbeat_age_s)
    return EngineView(
        engine_id, role, node, group, state, pid, seq, tokens,
        read_queue_tokens=read_queue_tokens, read_queue_bytes=hb.rq_bytes,
        hbm_used_bytes=hb.hbm_used_blocks * hb.hbm_block_bytes,
        hbm_free_bytes=hb.hbm_free_blocks * hb.hbm_block_bytes,
        hbm_fragmentation=na(hb.hbm_fragmentation),
        hbm_largest_free_blocks=hb.hbm_largest_free_run, nic_bytes=nic_bytes(hb),
        layers=_layers(hb),
        gpu_utilization=na(window.utilization) if window is not None else None,
        heartbeat_age_s=heartbeat_age_s,
        service_time_s=na(window.service_time_s) if window is not None else None,
        kv_wait_s=na(window.kv_wait_s) if window is not None else None)


def _util(rate: float | None, bandwidth: float) -> float | None:
    if rate is None or bandwidth <= 0:
        return None
    return max(0.0, rate / bandwidth)


def node_view(node: int, role: str, engine_ids: Sequence[int], hbs: Sequence[Heartbeat],
              read_queue_tokens: int, snic_rate: float | None, cnic_rate: float | None,
              snic_bw: float, cnic_bw: float) -> NodeView:
    """One node from its live engines' heartbeats (``hbs``), the read queue they last
    reported (tokens) and measured NIC rates (bytes/s, ``None`` until measured).

    ``snic_bw`` is the node's storage-NIC read bandwidth and ``cnic_bw`` one engine's
    compute NIC (bytes/s, <= 0: unshaped, utilisation not available); the compute NICs of
    the node's engines add up.
    """
    if not hbs:
        return NodeView(node, role, tuple(engine_ids),
                        snic_bandwidth_bytes_per_s=snic_bw if snic_bw > 0 else None)
    return NodeView(
        node, role, tuple(engine_ids),
        snic_utilization=_util(snic_rate, snic_bw),
        cnic_utilization=_util(cnic_rate, cnic_bw * len(engine_ids)),
        snic_bandwidth_bytes_per_s=snic_bw if snic_bw > 0 else None,
        read_queue_tokens=read_queue_tokens,
        read_queue_bytes=sum(hb.rq_bytes for hb in hbs),
        read_queue_blocks=sum(hb.rq_blocks for hb in hbs),
        dram_buffer_bytes=sum(hb.dram_cache_bytes for hb in hbs),
        storage_read_bytes=sum(int(hb.snic_read_bytes) for hb in hbs))
