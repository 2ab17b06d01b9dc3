"""Hierarchical scheduling in the runtime (paper 6.3, 8.1): a root over sub-schedulers.

Why: one scheduler's DE drain weighs every DE group and its thread serves every engine, so
its decision time and CPU grow with the cluster. :class:`HierarchicalScheduler` splits the
groups among ``subs`` full :class:`~dualpath_cli.runtime.scheduler.SchedulerService`
instances, each with its own thread and endpoint over a contiguous slice of the prefill and
of the decode groups (:func:`~dualpath_cli.core.hierarchy.partition`); an engine talks to
its own sub only. The root is :meth:`HierarchicalScheduler.submit`: it picks a sub for each
new turn with :func:`~dualpath_cli.core.hierarchy.route_to_subs` (the DE drain's own rule one
level up, over the tokens each sub holds: the simulator's root, sim/hierarchy.py), and the
sub then runs the flat algorithms over its own groups. A re-queued turn stays in its sub,
unless the sub lost every engine of a role (their processes exited): then the turns waiting
in it move to the serving subs, and new turns go only to those.

The facade presents the scheduler interface the rest of the system reads (submit, wait,
decisions, in-flight listing, settings and updates, reports, metrics, the read model) by
routing to one sub or merging across them. Request ids stay global (the root numbers turns
in submission order and hands each sub the next id), and the subs share one decision log
and one request ledger, so decision sequence numbers are unique and ordered, and
``explain`` finds any request.

Not here (refused with one line where they start): nodes joining a scheduler-only launch
(``--join``, the Ray backend) and the restartable scheduler's checkpoint.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from dualpath_cli.core.hierarchy import check_subs, partition, route_to_subs
from dualpath_cli.core.types import Request, Role
from dualpath_cli.errors import UsageError
from dualpath_cli.runtime.control import SchedulerChange, Settings
from dualpath_cli.runtime.decisions import DecisionLog
from dualpath_cli.runtime.engine_table import EngineState
from dualpath_cli.runtime.ledger import RequestLedger
from dualpath_cli.runtime.scheduler import SchedulerService
from dualpath_cli.runtime.turns import Ticket, TurnRequest
from dualpath_cli.runtime.wire import Heartbeat
from dualpath_cli.telemetry.registry import MetricsRegistry
from dualpath_cli.telemetry.view import (
    Decision,
    EngineView,
    LatencyHistogram,
    NodeView,
    SchedulerView,
)

__all__ = ["HierarchicalScheduler", "MergedRegistry"]


def _merge_latency(parts: Sequence[LatencyHistogram]) -> LatencyHistogram:
    """Histograms with the same bounds, added."""
    if not parts:
        return LatencyHistogram()
    bounds = [b for b, _ in parts[0].buckets]
    counts = [0] * len(bounds)
    for p in parts:
        for i, (_, c) in enumerate(p.buckets):
            counts[i] += c
    return LatencyHistogram(sum(p.count for p in parts), sum(p.sum_s for p in parts),
                            tuple(zip(bounds, counts, strict=True)))


class MergedRegistry:
    """The subs' metrics registries read as one (same name and labels: added up).

    Why: each sub counts its own turns, decisions and engines; ``/metrics`` and the API read
    the scheduler's registry once, and the cluster's totals are the sums.
    """

    def __init__(self, registries: Sequence[MetricsRegistry]) -> None:
        self.registries = list(registries)

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        """:meth:`MetricsRegistry.snapshot` of all of them, rows with equal labels summed."""
        out: dict[str, list[dict[str, Any]]] = {}
        for reg in self.registries:
            for name, rows in reg.snapshot().items():
                mine = out.setdefault(name, [])
                for row in rows:
                    same = next((r for r in mine if r["labels"] == row["labels"]), None)
                    if same is None:
                        mine.append({**row, **({"buckets": dict(row["buckets"])}
                                               if "buckets" in row else {})})
                    elif "buckets" in row:
                        same["count"] += row["count"]
                        same["sum"] += row["sum"]
                        for k, v in row["buckets"].items():
                            same["buckets"][k] = same["buckets"].get(k, 0) + v
                    else:
                        same["value"] += row["value"]
        return out

    def value(self, name: str, **labels: object) -> float:
        """:meth:`MetricsRegistry.value` summed over the subs."""
        return sum(reg.value(name, **labels) for reg in self.registries)


class HierarchicalScheduler:
    """A root and ``subs`` sub-schedulers (module doc); built before any engine registers.

    Args:
        make_sub: builds one flat scheduler; called ``len`` times with the sub's index and
            whether it keeps the decision log file (only sub 0 opens it: the subs share
            sub 0's log and ledger).
        prefill_groups / decode_groups: every group id of each role, in order.
        subs: how many sub-schedulers.

    Raises:
        UsageError: ``subs`` outside 1..min(prefill groups, decode groups).
    """

    def __init__(self, make_sub: Callable[[int, bool], SchedulerService],
                 prefill_groups: Sequence[int], decode_groups: Sequence[int],
                 subs: int) -> None:
        self.n_subs = check_subs(subs, len(prefill_groups), len(decode_groups))
        self.subs = [make_sub(k, k == 0) for k in range(self.n_subs)]
        first = self.subs[0]
        self.log: DecisionLog = first.log
        self.ledger: RequestLedger = first.ledger
        for sub in self.subs[1:]:  # one sequence of decisions, one ledger of requests
            sub.log.close()
            sub.log, sub.ledger = first.log, first.ledger
        self._group_sub: dict[tuple[str, int], int] = {}
        for role, groups in ((Role.PREFILL.value, prefill_groups),
                             (Role.DECODE.value, decode_groups)):
            for k, part in enumerate(partition(list(groups), self.n_subs)):
                for g in part:
                    self._group_sub[role, g] = k
        self._engine_sub: dict[int, int] = {}
        self._engine_role: dict[int, str] = {}
        self._dead: set[int] = set()
        self._lock = threading.Lock()  # the root's: rid order; never held by a sub's thread
        self._load_lock = threading.Lock()  # the subs' token loads only (done callbacks)
        self._sub_tokens = [0] * self.n_subs
        self._rid_sub: dict[int, int] = {}  # turns not finished -> the sub holding them
        self.moved = 0
        """Turns moved off a sub that lost a role (:meth:`_evacuate`)."""
        self.sub_turns = [0] * self.n_subs
        """Turns the root routed to each sub since start."""
        self._next_rid = 0
        own = MetricsRegistry()
        self._m_root = own.histogram("dualpath_scheduler_decision_latency_seconds",
                                     kind="root_route")
        self.registry = MergedRegistry([own, *(s.registry for s in self.subs)])

    # -- the tree -----------------------------------------------------------------------
    def sub_of_group(self, role: str, group: int) -> int:
        """The sub that owns ``role``'s group ``group``.

        Raises:
            UsageError: a group the partition does not know.
        """
        k = self._group_sub.get((role, group))
        if k is None:
            raise UsageError(f"{role} group {group} belongs to no sub-scheduler (hierarchical "
                             "scheduling splits the groups known at launch)")
        return k

    def address_for(self, role: str, group: int) -> str:
        """The endpoint the engines of ``role``'s group ``group`` talk to (their sub's)."""
        return self.subs[self.sub_of_group(role, group)].address

    def owner(self, engine_id: int) -> SchedulerService:
        """The sub that schedules engine ``engine_id``.

        Raises:
            UsageError: an engine no sub knows.
        """
        k = self._engine_sub.get(engine_id)
        if k is None:
            raise UsageError(f"no engine {engine_id} in this cluster")
        return self.subs[k]

    def role_gap_list(self) -> dict[str, tuple[float, str]]:
        """A role is missing when no sub has a ready engine of it: since the latest sub
        lost its last one."""
        gaps = [sub.role_gap_list() for sub in self.subs]
        out: dict[str, tuple[float, str]] = {}
        for role in {r for g in gaps for r in g}:
            if all(role in g for g in gaps):
                out[role] = max(g[role] for g in gaps)
        return out

    def sub_schedulers(self) -> tuple[SchedulerService, ...]:
        """The sub-schedulers, in order."""
        return tuple(self.subs)

    def schedulers(self) -> tuple[SchedulerService, ...]:
        """Every scheduler that serves engines: each sub."""
        return tuple(self.subs)

    @property
    def address(self) -> str:
        """Sub 0's endpoint (each engine is given its own sub's: :meth:`address_for`)."""
        return self.subs[0].address

    # -- lifecycle ----------------------------------------------------------------------
    def register(self, engine_id: int, role: str, node: int, group: int,
                 name: str = "") -> None:
        """Declare an engine with the sub that owns its group."""
        k = self.sub_of_group(role, group)
        self.subs[k].register(engine_id, role, node, group, name)
        self._engine_sub[engine_id] = k
        self._engine_role[engine_id] = role

    def start(self) -> None:
        """Start every sub's service thread."""
        for sub in self.subs:
            sub.start()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until every engine of every sub has said hello (TimeoutError otherwise)."""
        deadline = time.monotonic() + timeout
        for sub in self.subs:
            sub.wait_ready(max(0.0, deadline - time.monotonic()))

    def all_hello(self) -> bool:
        """Whether every engine of every sub has said hello."""
        return all(sub.all_hello() for sub in self.subs)

    def stop(self) -> None:
        """Stop every sub (they stop their engines); the shared log is closed by sub 0."""
        for sub in self.subs:
            sub.stop()

    def drain_engines(self, engine_ids: list[int], timeout_s: float) -> None:
        """Engines whose node leaves: left at once here (their turns re-queued), as before
        the flat scheduler let them finish first."""
        for eid in engine_ids:
            self.mark_dead(eid, "left")

    def mark_dead(self, engine_id: int, why: str = "exited") -> None:
        """Declare an engine dead now (``why`` as the flat scheduler's
        :meth:`~dualpath_cli.runtime.scheduler.SchedulerService.mark_dead`): its sub
        re-queues its turns; a sub left without a
        live engine of a role hands its waiting turns to the serving subs."""
        k = self._engine_sub.get(engine_id)
        if k is None:
            return
        with self._lock:
            self._dead.add(engine_id)
        self.subs[k].mark_dead(engine_id, why)
        self._evacuate(k)

    def _evacuate(self, k: int) -> None:
        """If sub ``k`` lost a role (every engine of it exited), move the turns it holds
        that wait for a fetch (its FIFO, routed, placed) to the serving subs, routed by the
        root's rule, under their ids; its turns running on its live engines stay. Why: no
        other sub would ever fetch them, and a role lost in one sub is not lost to the
        cluster."""
        with self._lock:
            ok = self._serving_subs()
            if k in ok or not ok:
                return
            moving = self.subs[k].take_waiting()
            if not moving:
                return
            with self._load_lock:
                loads = {j: self._sub_tokens[j] for j in ok}
            res = route_to_subs([Request(f.rid, len(f.req.tokens), 0) for f in moving], loads)
            for f, (_, j) in zip(moving, res.assignments, strict=True):
                n = len(f.req.tokens)
                with self._load_lock:
                    self._rid_sub[f.rid] = j
                    self._sub_tokens[k] -= n
                    self._sub_tokens[j] += n
                self.subs[j].adopt(f)
                self.moved += 1

    # -- the root -----------------------------------------------------------------------
    def _serving_subs(self) -> list[int]:
        """Subs with a prefill and a decode engine not seen dead."""
        roles: list[set[str]] = [set() for _ in self.subs]
        for eid, k in self._engine_sub.items():
            if eid not in self._dead:
                roles[k].add(self._engine_role[eid])
        return [k for k, r in enumerate(roles) if len(r) == 2]

    def _serving(self) -> list[int]:
        """Subs with a prefill and a decode engine not seen dead (all of them if none)."""
        return self._serving_subs() or list(range(self.n_subs))

    def submit(self, req: TurnRequest) -> Ticket:
        """Root decision: route the turn to the least-loaded sub (tokens it holds), which
        queues it under the next global request id; returns its ticket."""
        n = len(req.tokens)
        with self._lock:
            t0 = time.perf_counter()
            subs = self._serving() if self._dead else range(self.n_subs)
            with self._load_lock:
                loads = {k: self._sub_tokens[k] for k in subs}
            res = route_to_subs((Request(self._next_rid, n, 0),), loads)
            k = res.assignments[0][1]
            self._m_root.observe(time.perf_counter() - t0)
            sub = self.subs[k]
            rid = self._next_rid
            with self._load_lock:
                self._rid_sub[rid] = k
                self._sub_tokens[k] += n
            ticket = sub.submit(req, rid)  # the id is the root's, the queue the sub's
            self._next_rid += 1
            self.sub_turns[k] += 1

        def done() -> None:  # on the sub's thread: the load lock only (never the root's)
            with self._load_lock:
                self._sub_tokens[self._rid_sub.pop(rid)] -= n

        ticket.add_done_callback(done)
        return ticket

    def cancel(self, rid: int, error: Exception | None = None) -> None:
        """Drop turn ``rid`` in the sub that queued it (``SchedulerService.cancel``)."""
        with self._load_lock:
            k = self._rid_sub.get(rid)
        if k is not None:
            self.subs[k].cancel(rid, error)

    # -- reads, merged ------------------------------------------------------------------
    def decisions(self, since: int = -1) -> list[Decision]:
        """Logged decisions with ``seq > since``, oldest first (one log for all subs)."""
        return self.log.since(since)

    def request(self, rid: int) -> tuple[list[Decision], dict[str, Any] | None]:
        """Request ``rid``'s decisions and outcome (``SchedulerService.request``)."""
        return self.log.of_request(rid), self.ledger.outcome(rid)

    def in_flight(self, limit: int | None = None, rid: int | None = None
                  ) -> tuple[float, int, list[dict[str, Any]]]:
        """Turns not finished yet across the subs, oldest (lowest id) first."""
        total, rows = 0, []
        for sub in self.subs:
            _, n, part = sub.in_flight(limit, rid)
            total += n
            rows.extend(part)
        rows.sort(key=lambda r: r["rid"])
        return time.monotonic(), total, rows[:limit] if limit is not None else rows

    def settings(self) -> Settings:
        """Sub 0's settings (an update sets every sub; controllers step per sub)."""
        return self.subs[0].settings()

    def update(self, change: SchedulerChange) -> tuple[dict[str, Any], dict[str, Any]]:
        """Apply ``change`` to every sub (checked by the first); sub 0's ``(old, new)``."""
        out = self.subs[0].update(change)
        for sub in self.subs[1:]:
            sub.update(change)
        return out

    def control_signals(self) -> dict[str, float | None]:
        """Sub 0's controller signals (each sub's controllers read their own engines)."""
        return self.subs[0].control_signals()

    @property
    def quota_s(self) -> float:
        """The PE compute quota in force (sub 0's)."""
        return self.subs[0].quota_s

    @property
    def requeued(self) -> int:
        """Turns re-queued, all subs."""
        return sum(sub.requeued for sub in self.subs)

    @property
    def revived(self) -> int:
        """Silent engines that came back, all subs."""
        return sum(sub.revived for sub in self.subs)

    @property
    def dead_events(self) -> list[tuple[int, float]]:
        """(engine, when) of every death, all subs, in time order."""
        return sorted((ev for sub in self.subs for ev in sub.dead_events),
                      key=lambda ev: ev[1])

    @property
    def engines(self) -> dict[int, EngineState]:
        """Every sub's engines by id (a copy: register through :meth:`register`)."""
        out: dict[int, EngineState] = {}
        for sub in self.subs:
            out.update(sub.consistent_engines())
        return out

    def engine_states(self) -> dict[int, str]:
        """Each engine's state, every sub's (each read under its own lock)."""
        return {eid: st for sub in self.subs for eid, st in sub.engine_states().items()}

    def fresh_reports(self, after: float, timeout: float = 5.0) -> dict[int, dict[str, Any]]:
        """Reports of live engines received after ``after``, waiting up to ``timeout``."""
        deadline = time.monotonic() + timeout
        out: dict[int, dict[str, Any]] = {}
        for sub in self.subs:
            out.update(sub.fresh_reports(after, max(0.0, deadline - time.monotonic())))
        return out

    def reports(self) -> dict[int, dict[str, Any]]:
        """Every engine's latest heartbeat report."""
        return {eid: r for sub in self.subs for eid, r in sub.reports().items()}

    def heartbeats(self) -> dict[int, Heartbeat | None]:
        """Every engine's latest typed heartbeat."""
        return {eid: h for sub in self.subs for eid, h in sub.heartbeats().items()}

    def metrics(self, fresh: bool = False, timeout: float = 5.0) -> dict[int, dict[str, Any]]:
        """Every engine's metrics snapshot (``SchedulerService.metrics``), all subs."""
        deadline = time.monotonic() + timeout
        out: dict[int, dict[str, Any]] = {}
        for sub in self.subs:
            out.update(sub.metrics(fresh, max(0.0, deadline - time.monotonic())))
        return out

    def metric_frames(self) -> dict[int, dict[str, Any]]:
        """Every engine's last metrics frame, all subs."""
        return {eid: f for sub in self.subs for eid, f in sub.metric_frames().items()}

    def node_read_q(self) -> dict[int, int]:
        """Each node's read queue in tokens (a node's engines are in one sub)."""
        out: dict[int, int] = {}
        for sub in self.subs:
            for node, q in sub.node_read_q().items():
                out[node] = out.get(node, 0) + q
        return out

    def view_parts(self, snic_bw: float = 0.0, cnic_bw: float = 0.0,
                   ) -> tuple[tuple[EngineView, ...], tuple[NodeView, ...], SchedulerView]:
        """Engines, nodes and the scheduler merged over the subs (each sub's part is taken
        under its own lock; queues add up, thresholds are sub 0's, decision latency adds
        the root's routing as kind ``root_route``)."""
        parts = [sub.view_parts(snic_bw, cnic_bw) for sub in self.subs]
        engines = tuple(sorted((e for p in parts for e in p[0]), key=lambda e: e.engine_id))
        nodes = tuple(sorted((n for p in parts for n in p[1]), key=lambda n: n.node))
        views = [p[2] for p in parts]
        first = views[0]
        latency = {kind: _merge_latency([v.decision_latency[kind] for v in views
                                         if kind in v.decision_latency])
                   for kind in first.decision_latency}
        root = self._m_root
        latency["root_route"] = LatencyHistogram(root.count, root.sum, tuple(
            zip(root.bounds, root.cumulative(), strict=False)))
        private: dict[int, int] = {}
        for v in views:
            private.update(v.private_queues)
        cpu = [v.cpu_s for v in views]
        sched = SchedulerView(
            policy=first.policy, fifo_length=sum(v.fifo_length for v in views),
            private_queues=dict(sorted(private.items())),
            pe_queue_length=sum(v.pe_queue_length for v in views),
            in_flight=sum(v.in_flight for v in views), thresholds=first.thresholds,
            decisions=self.log.counts(), last_decision_seq=self.log.last_seq,
            requeued_total=sum(v.requeued_total for v in views),
            cpu_s=None if None in cpu else sum(c for c in cpu if c is not None),
            decision_latency=latency)
        return engines, nodes, sched
