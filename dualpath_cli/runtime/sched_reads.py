"""What a running scheduler answers: decisions, turns in flight, engines' reports and
metrics, and the read model (engines, nodes, the scheduler) as one consistent snapshot.

Each read takes the scheduler's lock on the caller's thread for one pass over its state;
nothing here is on a turn's path.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

from dualpath_cli.runtime.engine_table import EngineState
from dualpath_cli.runtime.readmodel import engine_view, node_view
from dualpath_cli.runtime.sched_core import SchedulerCore
from dualpath_cli.runtime.wire import Heartbeat, MetricsRequest
from dualpath_cli.telemetry.frames import expand_frame, is_frame
from dualpath_cli.telemetry.registry import Histogram
from dualpath_cli.telemetry.view import (
    Decision,
    EngineView,
    LatencyHistogram,
    NodeView,
    SchedulerView,
    Thresholds,
)

__all__ = ["SchedulerReads"]


def _latency(h: Histogram) -> LatencyHistogram:
    """A histogram as the view carries it (finite bounds; ``count`` is the +Inf bucket)."""
    cumulative = h.cumulative()
    return LatencyHistogram(h.count, h.sum, tuple(zip(h.bounds, cumulative, strict=False)))



class SchedulerReads(SchedulerCore):
    """The scheduler's read accessors (module doc)."""

    @property
    def next_request_id(self) -> int:
        """The id the next admitted turn gets (it moves with every admission)."""
        return self._next_rid

    def decisions(self, since: int = -1) -> list[Decision]:
        """Logged decisions with ``seq > since``, oldest first (at most the ring's size)."""
        return self.log.since(since)

    def request(self, rid: int) -> tuple[list[Decision], dict[str, Any] | None]:
        """Request ``rid``'s kept decisions (one per attempt, oldest first) and its outcome
        (``None`` while it runs, or once forgotten)."""
        return self.log.of_request(rid), self.ledger.outcome(rid)

    def in_flight(self, limit: int | None = None, rid: int | None = None
                  ) -> tuple[float, int, list[dict[str, Any]]]:
        """Turns not finished yet, oldest first (at most ``limit``; only ``rid`` if given):
        now (monotonic), how many are in flight, and each one's phase (``queued``,
        ``routed`` to a DE group, ``placed`` on a DE awaiting a PE, ``prefill``: KV loading
        and prefilling, ``decode``: first token out), engines, read split and timeline so
        far (diagnose/explain.py words it). A read accessor on the caller's thread: one
        pass over the queues under the lock, nothing added to the turns' path."""
        with self._lock:
            now = time.monotonic()
            total = len(self.flights)
            if rid is not None:
                one = self.flights.get(rid)
                flights = [one] if one is not None else []
            else:  # rids are given in order under this lock: the dict is oldest first
                flights = list(self.flights.values())[:limit]
            want = {f.rid for f in flights}
            queued = {f.rid for f in self.queue if f.rid in want}
            routed = {f.rid for q in self.private.values() for f in q if f.rid in want}
            placed = {f.rid for f in self.pe_queue if f.rid in want}
            rows: list[dict[str, Any]] = [{
                     "rid": f.rid, "agent": f.req.agent, "turn": f.req.turn,
                     "attempt": f.att, "submitted": f.submitted,
                     "phase": ("queued" if f.rid in queued else "routed" if f.rid in routed
                               else "placed" if f.rid in placed
                               else "decode" if f.prefilled else "prefill"),
                     "first_at": f.first_at or None, "prompt_tokens": len(f.req.tokens),
                     "gen": f.req.gen, "cached": f.cached, "pe": f.pe, "de": f.de,
                     "de_group": f.de_group, "pe_tokens": f.pe_tokens} for f in flights]
        progress = self.ledger.progress([fl.rid for fl in flights])
        for fl, row in zip(flights, rows, strict=True):
            row.update(progress.get(fl.rid, {}))
        return now, total, rows

    def fresh_reports(self, after: float, timeout: float = 5.0) -> dict[int, dict[str, Any]]:
        """Reports of live engines all received after ``after`` (monotonic), waiting for them."""
        deadline = time.monotonic() + timeout
        with self._registered:
            while True:
                live = [e for e in self.engines.values() if e.alive]
                if all(e.hb_at > after for e in live):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._registered.wait(left)
            return {eid: e.report for eid, e in self.engines.items()}

    def reports(self) -> dict[int, dict[str, Any]]:
        """Latest heartbeat report of each engine, as plain dicts (see ``EngineState.report``)."""
        with self._lock:
            return {eid: e.report for eid, e in self.engines.items()}

    def heartbeats(self) -> dict[int, Heartbeat | None]:
        """Latest typed heartbeat of each engine (``None`` before the first)."""
        with self._lock:
            return {eid: e.hb for eid, e in self.engines.items()}

    def metrics(self, fresh: bool = False, timeout: float = 5.0) -> dict[int, dict[str, Any]]:
        """Every engine's metrics snapshot (``MetricsRegistry.snapshot()`` form) by engine id.

        Heartbeats carry a snapshot every ``metrics_s``; ``fresh`` asks every live engine for
        one now and waits (up to ``timeout``) until all have answered. Each value holds
        ``role``, ``node``, ``alive``, ``age_s`` (seconds since the snapshot) and ``metrics``.
        """
        with self._registered:
            asked = time.monotonic()
            if fresh:
                for e in self.engines.values():
                    if e.alive and e.address:
                        self._send(e.address, MetricsRequest())
                deadline = asked + timeout
                while any(e.alive and e.metrics_at <= asked for e in self.engines.values()):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._registered.wait(left)
            now = time.monotonic()
            return {eid: {"role": e.role, "node": e.node, "alive": e.alive,
                          "age_s": now - e.metrics_at if e.metrics_at else None,
                          "metrics": expand_frame(e.metrics) if is_frame(e.metrics)
                          else e.metrics} for eid, e in self.engines.items()}

    def metric_frames(self) -> dict[int, dict[str, Any]]:
        """Every engine's last metrics frame as heartbeated (telemetry/frames.py), by id:
        what ``/metrics`` merges (``metrics()`` gives them as snapshot rows)."""
        with self._registered:
            return {eid: e.metrics for eid, e in self.engines.items() if is_frame(e.metrics)}

    def node_read_q(self) -> dict[int, int]:
        """The scheduler's view of each node's read queue in tokens."""
        with self._lock:
            out: dict[int, int] = collections.defaultdict(int)
            for e in self.engines.values():
                if e.alive:
                    out[e.node] += e.read_q
            return dict(out)

    # -- read model ---------------------------------------------------------------------
    def view_parts(self, snic_bw: float = 0.0, cnic_bw: float = 0.0,
                   ) -> tuple[tuple[EngineView, ...], tuple[NodeView, ...], SchedulerView]:
        """Engines, nodes and the scheduler as one consistent snapshot (taken under the lock).

        Args:
            snic_bw: a node's storage-NIC read bandwidth, bytes/s (<= 0: unshaped).
            cnic_bw: one engine's compute-NIC bandwidth, bytes/s (<= 0: unshaped).
        """
        me = os.getpid()
        with self._lock:
            now = time.monotonic()
            seq, tok, _ = self._loads()
            engines = tuple(engine_view(
                e.engine_id, e.role, e.node, e.group, e.state,
                e.pid if e.pid and e.pid != me else None,  # in-process engines have no pid
                seq[e.engine_id], tok[e.engine_id], e.rq if e.hb is not None else None, e.hb,
                now - e.last_seen if e.address else None, e.compute)
                for e in sorted(self.engines.values(), key=lambda x: x.engine_id))
            engines = tuple(dataclasses.replace(v, node_name=self.engines[v.engine_id].name
                                                or None,
                                                kv_lost_turns=self.engines[v.engine_id].kv_lost)
                            for v in engines)
            by_node: dict[int, list[EngineState]] = collections.defaultdict(list)
            for e in self.engines.values():
                by_node[e.node].append(e)
            nodes = []
            for node in sorted(by_node):
                members = sorted(by_node[node], key=lambda x: x.engine_id)
                live = [e for e in members if e.alive and e.hb is not None]
                snic = [e.snic_rate.rate for e in live]
                cnic = [e.cnic_rate.rate for e in live]
                nodes.append(node_view(
                    node, members[0].role, [e.engine_id for e in members],
                    [e.hb for e in live if e.hb is not None], sum(e.rq for e in live),
                    sum(r for r in snic if r is not None) if live and None not in snic else None,
                    sum(r for r in cnic if r is not None) if live and None not in cnic else None,
                    snic_bw, cnic_bw))
                if members[0].name:
                    nodes[-1] = dataclasses.replace(nodes[-1], name=members[0].name)
            sched = SchedulerView(
                policy=self.policy_name, fifo_length=len(self.queue),
                private_queues={g: len(q) for g, q in sorted(self.private.items())},
                pe_queue_length=len(self.pe_queue),
                in_flight=sum(1 for f in self.flights.values() if f.pe >= 0),
                thresholds=Thresholds(self.params.alpha, self.params.beta,
                                      self.params.z_factor, self.quota_s, self.read_side,
                                      dict(self.sources), self.controllers.state()),
                decisions=self.log.counts(), last_decision_seq=self.log.last_seq,
                requeued_total=self.requeued, cpu_s=self._m_cpu.value,
                decision_latency={kind: _latency(h) for kind, h in self._m_decide.items()})
            self._count_engines()
        return engines, tuple(nodes), sched

    def consistent_engines(self) -> dict[int, EngineState]:
        """The engines by id, copied under the lock (the entries are the live records)."""
        with self._lock:
            return dict(self.engines)

    def engine_states(self) -> dict[int, str]:
        """Each engine's state (``starting``, ``ready``, ``dead``, ``left``), read at once."""
        with self._lock:
            return {eid: e.state for eid, e in self.engines.items()}

    def wait_heartbeat(self, engine_id: int, until: Callable[[Heartbeat], bool],
                       timeout: float) -> Heartbeat | None:
        """Wait for a heartbeat of engine ``engine_id`` that ``until`` accepts; ``None`` if
        ``timeout`` seconds pass first, or the engine is unknown or dies meanwhile."""
        deadline = time.monotonic() + timeout
        with self._registered:  # the scheduler's lock; heartbeats notify it
            while True:
                e = self.engines.get(engine_id)
                if e is None:
                    return None
                if e.hb is not None and until(e.hb):
                    return e.hb
                left = deadline - time.monotonic()
                if left <= 0 or not e.alive:
                    return None
                self._registered.wait(left)
