"""The global scheduler service: FIFO, pull-based group fetches, decisions from core/ only.

Runs in the launcher on its own thread and endpoint. Engines say ``hello``, send heartbeats
and read-queue reports; group leaders send ``fetch`` periodically (pull). A request goes
through two fetches, each deciding with core/ functions only:

1. **DE group fetch** (paper 6.3): phase 1 :func:`~dualpath_cli.core.de_schedule.de_route`
   drains the global FIFO onto the DE groups' private queues (min group load), phase 2
   :func:`~dualpath_cli.core.de_schedule.de_place` places the fetching group's private queue
   on its DEs (HBM set R, the Z rule). Placed requests wait, in order, for a PE.
2. **PE group fetch** (paper 6.2, 6.4): :func:`~dualpath_cli.core.pe_fetch.pe_fetch` picks the
   PE, then :func:`~dualpath_cli.core.policies.read_plan` picks the read side (or a split)
   from the two nodes' read queues, and the chosen nodes are charged at once with
   :func:`~dualpath_cli.core.policies.charge_read`.

Read queues: a node's read_q is what its loaders last reported (``rq``, tokens queued or in
flight) plus the reads dispatched since that the report did not include yet. Each dispatch
carries a per-engine sequence number; a report says the last one it counted (``seen``), which
retires those pending charges. Without the pending charges every decision in the gap between
two reports would see the same stale queues and herd onto one side.

Every decision is logged (a bounded ring, :class:`~dualpath_cli.runtime.decisions.DecisionLog`,
and optionally one JSON line each) with its inputs as they were *before* it (queue head,
snapshots, group loads, read queues, the thresholds in force) and its outcome, classed by the
chosen PE's class (C1/C2/C3) and the chosen DE's (normal/high-token). Messages are the typed
records of :mod:`~dualpath_cli.runtime.wire`; heartbeats feed :meth:`SchedulerService.view`,
and :meth:`SchedulerService.update` changes alpha, beta, the PE quota, the read side and the
dynamic controllers of a running scheduler. The controllers
(:class:`~dualpath_cli.core.controllers.Controllers`: alpha from the busiest storage NIC's
utilisation, beta from the PEs' GPU utilisation, the quota from the TTFT tail) step once per
``control_interval_s`` on what the heartbeats measured; each move is a ``control`` entry in
the decision log with its inputs, and the last step of each is in the view. An engine that stops
heartbeating (or whose process exits) is marked dead; its in-flight requests are cancelled on
their other engine and re-queued at the head of the FIFO with a new attempt number, so none
is lost. An engine that was only silent (a stall longer than the heartbeat timeout on a
loaded host) and reports again is told to cancel what it held and scheduled on again.

Where the code lives: the fields and shared bookkeeping in :mod:`~dualpath_cli.runtime.sched_core`,
the controls in :mod:`~dualpath_cli.runtime.sched_control`, the decisions in
:mod:`~dualpath_cli.runtime.sched_dispatch`, the loop and message handlers in
:mod:`~dualpath_cli.runtime.sched_loop`, the reads in :mod:`~dualpath_cli.runtime.sched_reads`;
a turn's types in :mod:`~dualpath_cli.runtime.turns`, the engines' in
:mod:`~dualpath_cli.runtime.engine_table`. :class:`SchedulerService` is all of them: its
constructor, its lifecycle, the commands other modules send through it and its checkpoint
state (:meth:`SchedulerService.export_state`, :meth:`SchedulerService.import_state`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dualpath_cli.core.controllers import CONTROLLERS, Controllers
from dualpath_cli.core.de_schedule import GroupLoads
from dualpath_cli.core.layout import Namespace, PrefixKeyCache, PresentPrefixCache
from dualpath_cli.core.policies import SchedParams, get_policy
from dualpath_cli.core.types import Role
from dualpath_cli.errors import UsageError
from dualpath_cli.runtime.decisions import RING_BYTES, DecisionLog
from dualpath_cli.runtime.engine_table import EngineState, EngineTable
from dualpath_cli.runtime.ledger import RequestLedger
from dualpath_cli.runtime.options import DEFAULT_BATCH_WINDOW_S
from dualpath_cli.runtime.sched_loop import MessageLoop
from dualpath_cli.runtime.sched_reads import SchedulerReads
from dualpath_cli.runtime.sched_state import SchedulerState
from dualpath_cli.runtime.turns import Flight, Ticket, TokenStream, TurnRequest
from dualpath_cli.runtime.wire import (
    Cancel,
    Done,
    Fetch,
    First,
    Heartbeat,
    Hello,
    QueueReport,
    ReadFailed,
    Stop,
    Tokens,
    WireMessage,
)
from dualpath_cli.storage import KVStore
from dualpath_cli.telemetry.registry import MetricsRegistry
from dualpath_cli.transfer.base import Fabric, Message

__all__ = ["SchedulerService"]


class SchedulerService(MessageLoop, SchedulerReads):
    """The launcher-side scheduler. See the module docstring.

    The process that hosts it should pace its garbage collector
    (:func:`~dualpath_cli.runtime.gctune.pace_gc_for_scheduler`): the launcher does.

    Args:
        fabric: the transfer fabric the engines use.
        store: used for prefix lookups (``contains``) only.
        namespace: prefix-key namespace (model, layout, block shape).
        policy: a policy name of :data:`dualpath_cli.core.policies.POLICIES` (read rule,
            layerwise prefill, NIC shaping).
        params: resolved scheduler thresholds (tokens).
        hbm_tokens: KV capacity of each DE in tokens.
        heartbeat_timeout: seconds without a heartbeat before an engine is declared dead.
        decision_log: JSONL path for decisions (None: keep them in memory only).
        decision_ring: how many decisions the in-memory ring keeps (default 10,000).
        decision_ring_bytes: bytes the ring's packed decisions may hold (and, apart, the
            ledger's finished requests' timelines).
        prefix_cache_tokens: prompt tokens kept to reuse agents' prefix keys (the
            :class:`~dualpath_cli.core.layout.PrefixKeyCache` bound).
        quota_s: the PE compute quota the engines start with (seconds).
        sources: where each threshold came from (keys ``alpha``, ``beta``, ``z_factor``,
            ``quota``, ``read_side``; values ``config``, ``flag``, ``default``...); a key not
            given reads ``config``.
        layerwise_prefill: False turns layerwise prefill off whatever the policy.
        controllers: controller name (``alpha``, ``beta``, ``quota``) -> on.
        control_interval_s: seconds between two controller steps.
        batch_window_s: the loop's wait between two batches of messages
            (:data:`DEFAULT_BATCH_WINDOW_S`; 0: each message handled as it arrives).
        snic_bw: a node's storage-NIC read bandwidth, bytes/s (<= 0: unshaped; alpha's
            controller then has no signal).
    """

    def __init__(self, fabric: Fabric, store: KVStore, namespace: Namespace, policy: str,
                 params: SchedParams, hbm_tokens: int, *, heartbeat_timeout: float = 5.0,
                 decision_log: Path | None = None, decision_ring: int = 10_000,
                 decision_ring_bytes: int = RING_BYTES,
                 prefix_cache_tokens: int = 32 << 20,
                 quota_s: float = 0.3, sources: Mapping[str, str] | None = None,
                 layerwise_prefill: bool = True, controllers: Mapping[str, bool] | None = None,
                 control_interval_s: float = 1.0, snic_bw: float = 0.0,
                 batch_window_s: float = DEFAULT_BATCH_WINDOW_S) -> None:
        row = get_policy(policy)
        self.layerwise = row.layerwise and layerwise_prefill
        self.shaped = row.shaped
        self.policy_name = row.name
        self.read_side = row.name
        self.policy = row
        self.params = params
        self.quota_s = quota_s
        self.sources = {k: "config" for k in ("alpha", "beta", "z_factor", "quota",
                                              "read_side")}
        self.sources.update(sources or {})
        self._sources_copy: dict[str, str] = {}  # see _sources_kept
        self.store = store
        self.ns = namespace
        self.bt = namespace.shape.block_tokens
        self.hbm_tokens = hbm_tokens
        self.hb_timeout = heartbeat_timeout
        self.ep = fabric.endpoint("scheduler")
        self.address = self.ep.address
        self.engines = EngineTable()
        self.queue: collections.deque[Flight] = collections.deque()  # global FIFO
        #: (role, group) -> the engine that fetches for it (the last one seen fetching)
        self._fetchers: dict[tuple[str, int], int] = {}
        #: (role, group) -> the leader its engines were told to send queue reports to
        self._report_to: dict[tuple[str, int], int] = {}
        self.private: dict[int, collections.deque[Flight]] = collections.defaultdict(
            collections.deque)  # DE group -> routed, not yet placed
        self.pe_queue: collections.deque[Flight] = collections.deque()  # placed, need a PE
        self.flights: dict[int, Flight] = {}
        self.registry = MetricsRegistry()
        """Scheduler-side metrics (TTFT/TPOT, decisions, requeues, engines by state)."""
        self.log = DecisionLog(decision_ring, self.registry, decision_log,
                               budget=decision_ring_bytes)
        self.ledger = RequestLedger(self.registry, namespace, outcomes=decision_ring,
                                    outcomes_bytes=decision_ring_bytes)
        """Why each request's blocks missed, and finished requests' timelines (explain)."""
        self.dead_events: list[tuple[int, float]] = []
        self.requeued = 0
        self.revived = 0
        self.bad_messages = 0
        # each kind an engine sends the scheduler -> its handler (other kinds: seen only)
        self._handlers: dict[type, Callable[[EngineState, Any, float], None]] = {
            Hello: self._on_hello, QueueReport: self._on_report, Heartbeat: self._on_heartbeat,
            Fetch: self._on_fetch, First: self._on_first, Tokens: self._on_tokens,
            Done: self._on_done,
            ReadFailed: self._on_read_failed}
        self._m_ttft = self.registry.histogram("dualpath_ttft_seconds")
        self._m_tpot = self.registry.histogram("dualpath_tpot_seconds")
        # what deciding costs (diagnose scaling): a scheduling call that finds work appends
        # its wall time (a perf_counter pair and an append on the hot path); the heartbeat
        # sweep moves the times into the histograms and samples the thread's CPU
        self._pe_fetch_s: list[float] = []
        self._de_fetch_s: list[float] = []
        self._m_decide = {kind: self.registry.histogram(
            "dualpath_scheduler_decision_latency_seconds", kind=kind)
            for kind in ("de_fetch", "pe_fetch")}
        self._m_cpu = self.registry.counter("dualpath_scheduler_cpu_seconds_total")
        self._cpu_at = 0.0  # the service thread's CPU seconds at the last sample
        self._lock = threading.RLock()
        self._next_rid = 0
        self._ordinal = 0
        self._stop = threading.Event()
        self._registered = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._loop, daemon=True, name="scheduler")
        # the loop's seams: what it calls for each message and for each sweep (the heartbeat
        # check and cost sample). The bench wraps them to split the thread's CPU, and tests
        # to check invariants between messages, instead of shadowing the methods on the
        # instance (which a compiled class would not allow)
        self.on_message: Callable[[Message], None] = self._handle
        self.on_sweep: Callable[[], None] = self._sweep
        if not control_interval_s > 0:
            raise UsageError(f"control interval {control_interval_s!r}: must be > 0 s")
        self.control_interval_s = control_interval_s
        if not batch_window_s >= 0:
            raise UsageError(f"batch window {batch_window_s!r}: must be >= 0 s")
        self.batch_window_s = batch_window_s
        self.snic_bw = snic_bw
        self.snic_scale: dict[int, float] = {}
        """Node -> fraction of ``snic_bw`` its NIC runs at (a throttle fault lowers it)."""
        self.controllers = Controllers(
            on={name: bool((controllers or {}).get(name)) for name in CONTROLLERS},
            bases={"alpha": float(params.alpha), "beta": float(params.beta),
                   "quota": float(quota_s)},
            minimum={"beta": float(namespace.shape.block_tokens)})
        self._ctl_values = {"alpha": float(params.alpha), "beta": float(params.beta),
                            "quota": float(quota_s)}
        self._ctl_next = time.monotonic() + control_interval_s
        self._ttfts: list[float] = []
        # hot-path state (see _lookup, _load_delta, _members): the per-agent prefix keys,
        # each engine's load kept as turns move, and the engines indexed by group and node
        self._prefix = PrefixKeyCache(namespace, max_tokens=prefix_cache_tokens)
        self._present = PresentPrefixCache()
        self._seq: dict[int, int] = collections.defaultdict(int)
        self._tok: dict[int, int] = collections.defaultdict(int)
        self._hbm_used: dict[int, int] = collections.defaultdict(int)
        self._de_group_tok: dict[int, int] = collections.defaultdict(int)  # DE group -> tok
        # DE group -> tokens of the turns routed to it, not placed yet (its private queue)
        self._routed_tok: dict[int, int] = collections.defaultdict(int)
        # phase 1's input, kept: every live DE group's tok plus routed tok (None: rebuilt
        # at the next DE fetch, as when the live groups change)
        self._group_loads: GroupLoads | None = None
        self._group_loads_for: object = None
        self._index_n = -1
        self._by_group: dict[str, dict[int, list[EngineState]]] = {}
        self._by_node: dict[int, list[EngineState]] = {}
        self._live_version = 0  # bumped when an engine says hello, dies or comes back
        self._live_key: tuple[int, int] = (-1, -1)
        self._live: dict[str, dict[int, list[EngineState]]] = {}
        # no engine yet: both roles are missing until one says hello (_count_engines)
        self.role_gaps: dict[str, tuple[float, str]] = dict.fromkeys(
            (Role.PREFILL.value, Role.DECODE.value), (time.time(), ""))
        self.last_gone: dict[str, str] = {}
        self._draining: set[int] = set()  # engines whose node is leaving (_settle_drains)


    # -- lifecycle ---------------------------------------------------------------------
    def register(self, engine_id: int, role: str, node: int, group: int,
                 name: str = "") -> None:
        """Declare an engine before it starts (its address comes with ``hello``); ``name``:
        its node's operator name (``--node D0``)."""
        with self._lock:
            self.engines[engine_id] = EngineState(engine_id, role, node, group, name=name,
                                                  last_seen=time.monotonic())
            self._count_engines()

    def start(self) -> None:
        """Start the service thread."""
        self._thread.start()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until every registered engine has said hello."""
        deadline = time.monotonic() + timeout
        with self._registered:
            while not all(e.address for e in self.engines.values() if e.alive):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [e.engine_id for e in self.engines.values()
                               if e.alive and not e.address]
                    raise TimeoutError(f"engines {missing} did not start within {timeout} s")
                self._registered.wait(left)

    def all_hello(self) -> bool:
        """Whether every registered engine that is still the cluster's has said hello (one
        removed before its hello is not waited for)."""
        with self._lock:
            return all(e.address for e in self.engines.values() if e.alive)

    def role_gap_list(self) -> dict[str, tuple[float, str]]:
        """Roles with no ready engine: since when (wall clock) and the last departure."""
        with self._lock:
            return dict(self.role_gaps)

    def submit(self, req: TurnRequest, rid: int | None = None) -> Ticket:
        """Queue a turn; returns its ticket. ``rid``: the id a hierarchical root gave it
        (ids are global there); otherwise the next one. Later turns are numbered after it."""
        with self._lock:
            if rid is None:
                rid = self._next_rid
            self._next_rid = rid + 1
            ticket = Ticket(TokenStream(req.gen), functools.partial(self.cancel, rid),
                            rid=rid) if req.stream else Ticket(rid=rid)
            flight = Flight(rid, req, ticket, time.monotonic())
            self._lookup(flight)
            self.flights[rid] = flight
            self.queue.append(flight)
        return ticket

    def mark_dead(self, engine_id: int, why: str = "exited") -> None:
        """Declare an engine dead now, for good: ``exited`` (process exit seen by the
        cluster) or ``left`` (its node left on purpose: state ``left``, not counted as an
        unhealthy engine)."""
        with self._lock:
            self._dead(engine_id, why)

    def drain_engines(self, engine_ids: list[int], timeout_s: float) -> None:
        """Let engines leave politely (their node is leaving): no new turn goes to them,
        turns placed on them and not started go back to the queue, those they run finish;
        each is ``left`` once it holds none, or at ``timeout_s`` (the rest re-queued).
        One that never said hello is left at once."""
        with self._lock:
            until = time.monotonic() + timeout_s
            for eid in engine_ids:
                e = self.engines.get(eid)
                if e is None or not e.alive:
                    continue
                if not e.address:
                    self._dead(eid, "left")
                    continue
                e.drain_until = until
                self._draining.add(eid)
                self.last_gone[e.role] = f"{e.name or f'engine {eid}'} left"
            self._live_version += 1
            self._start_drains()
            self._settle_drains()
            self._count_engines()

    def stop(self) -> None:
        """Tell engines to stop and end the service thread."""
        with self._lock:
            for e in self.engines.values():
                if e.address and e.alive:
                    self._send(e.address, Stop())
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.ep.close()
        self.log.close()


    # -- its shape (runtime/scheduler_protocol.py) --------------------------------------
    def sub_schedulers(self) -> tuple[SchedulerService, ...]:
        """None: a flat scheduler has no sub-schedulers."""
        return ()

    def schedulers(self) -> tuple[SchedulerService, ...]:
        """Itself: the one scheduler that serves engines."""
        return (self,)

    def owner(self, engine_id: int) -> SchedulerService:
        """Itself: it serves every engine."""
        return self

    def address_for(self, role: str, group: int) -> str:
        """Its own endpoint: every group talks to it."""
        return self.address

    # -- commands other modules send through the scheduler ------------------------------
    def send_to_engine(self, engine_id: int, msg: WireMessage) -> bool:
        """Send ``msg`` to engine ``engine_id`` if it is alive and said hello (under the
        lock: the endpoint is the loop's); whether it was sent (False too when the endpoint
        dropped it: the engine did not take it within the send timeout)."""
        with self._lock:
            e = self.engines.get(engine_id)
            if e is None or not (e.alive and e.address):
                return False
            return self._send(e.address, msg)

    def set_snic_scale(self, scale: Mapping[int, float]) -> None:
        """Node -> fraction of ``snic_bw`` its storage NIC runs at (a throttle fault's)."""
        with self._lock:
            self.snic_scale = dict(scale)

    def take_waiting(self) -> list[Flight]:
        """Remove and return the turns that wait for a fetch (FIFO, routed, placed), oldest
        queue first, each reset to be routed anew; the turns running on engines stay.
        Why: a hierarchical root moves them to a sub that still serves (runtime/hierarchy.py)."""
        with self._lock:
            moving = [*self.queue, *(f for q in self.private.values() for f in q),
                      *self.pe_queue]
            self.queue.clear()
            self.private.clear()
            self.pe_queue.clear()
            for f in moving:
                del self.flights[f.rid]
                f.de = f.de_group = -1
                f.route, f.place = None, {}
            self._recount_loads()  # the placed turns counted on their DEs
        return moving

    def adopt(self, flight: Flight) -> None:
        """Queue a turn another scheduler held (:meth:`take_waiting`), under its own id."""
        with self._lock:
            self.flights[flight.rid] = flight
            self.queue.append(flight)

    # -- checkpoint state -----------------------------------------------------------------
    def export_state(self) -> SchedulerState:
        """What a checkpoint saves, copied under the lock as plain rows (the least work
        while every fetch and message waits: runtime/checkpoint.py builds the JSON)."""
        with self._lock:
            where: dict[int, str] = {}
            for f in self.queue:
                where[f.rid] = "fifo"
            for g, q in self.private.items():
                for f in q:
                    where[f.rid] = f"group:{g}"
            for f in self.pe_queue:
                where[f.rid] = "pe_queue"
            flights = [(f.rid, f.req, f.att, f.submitted, f.max_hit_blocks, f.pe, f.de)
                       for f in self.flights.values()]
            tickets = {rid: f.ticket for rid, f in self.flights.items()}
            engines = [(e.engine_id, e.role, e.node, e.group, e.address, e.pid, e.alive,
                        e.dead_why, e.next_seq) for e in self.engines.values()]
            params = self.params
            return SchedulerState(
                address=self.address, next_rid=self._next_rid, ordinal=self._ordinal,
                decision_seq=self.log.last_seq or 0, requeued=self.requeued,
                policy=self.policy_name, read_side=self.read_side, alpha=params.alpha,
                beta=params.beta, z_factor=params.z_factor, quota_s=self.quota_s,
                sources=dict(self.sources),
                controllers={n: bool(self.controllers.on.get(n)) for n in CONTROLLERS},
                controller_values=dict(self._ctl_values), flights=flights, where=where,
                engines=engines, tickets=tickets, taken_at=time.monotonic())

    def import_state(self, state: SchedulerState, *, with_engines: bool) -> tuple[int, int]:
        """Put ``state`` into this scheduler (fresh, its thread not started); how many turns
        came back and how many of them were re-queued (they were past the FIFO).

        Every turn gets a new attempt number (answers of the old one are stale) and joins
        one FIFO in admission order; the engines of a re-queued turn are told to cancel the
        old attempt. ``with_engines`` also puts back the engines (nodes that joined keep
        running through a scheduler restart and reconnect). Counters only move forward.

        Raises:
            ValueError: the state's read side shapes the NICs where this launch does not,
                or the other way round.
        """
        row = get_policy(state.read_side)
        if row.shaped != self.shaped:
            raise ValueError(f"read side {row.name!r} does not match this launch's NIC "
                             "shaping")
        now = time.monotonic()
        with self._lock:
            self.params = dataclasses.replace(self.params, alpha=state.alpha,
                                              beta=state.beta, z_factor=state.z_factor)
            self.quota_s = state.quota_s
            self.read_side, self.policy = row.name, row
            self.sources.update(state.sources)
            for name, on in state.controllers.items():
                if name in CONTROLLERS:
                    self.controllers.on[name] = on
            for name, value in state.controller_values.items():
                if name in CONTROLLERS:
                    self._ctl_values[name] = value
                    if self.sources.get(name) == "api":
                        self.controllers.rebase(name, value)
            self._next_rid = max(self._next_rid, state.next_rid)
            self._ordinal = max(self._ordinal, state.ordinal)
            self.log.continue_after(state.decision_seq)
            self.requeued = state.requeued
            if with_engines:
                for eid, role, node, group, address, pid, alive, why, seq in state.engines:
                    e = EngineState(eid, role, node, group, address=address, pid=pid,
                                    last_seen=now, alive=alive, dead_why=why)
                    e.next_seq = seq
                    self.engines[eid] = e
            requeued = 0
            front: list[Flight] = []
            for rid, req, att, submitted, hit, pe, de in sorted(state.flights,
                                                                key=lambda r: r[0]):
                f = Flight(rid, req, Ticket(rid=rid), submitted)
                f.att = att + 1  # a new attempt: answers of the old one (if any) are stale
                f.max_hit_blocks = hit
                if state.where.get(rid) != "fifo":
                    requeued += 1
                    for eid in (pe, de):
                        old = self.engines.get(eid)
                        if old is not None and old.alive and old.address:
                            self._send(old.address, Cancel(rid, att))
                self._lookup(f)  # the store may hold more of it by now
                self.flights[rid] = f
                front.append(f)
            # one FIFO in admission order (a re-queued turn, admitted earlier, stays ahead)
            self.queue.extend(front)
            self.requeued += requeued
            if requeued:
                self.registry.counter("dualpath_scheduler_requeued_turns_total",
                                      reason="scheduler_restart").inc(requeued)
            self._count_engines()
        return len(front), requeued

    def tickets(self) -> dict[int, Ticket]:
        """rid -> ticket of every turn not finished (a restored scheduler's are new)."""
        with self._lock:
            return {rid: f.ticket for rid, f in self.flights.items()}
