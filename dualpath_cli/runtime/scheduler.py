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
"""

from __future__ import annotations

import array
import collections
import dataclasses
import functools
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from dualpath_cli.core.controllers import (
    CONFIG_KEYS,
    CONTROLLERS,
    Controllers,
    ControlStep,
    ttft_tail,
)
from dualpath_cli.core.de_schedule import (
    GroupLoads,
    de_place,
    de_route_in_place,
    placement_classes,
)
from dualpath_cli.core.layout import (
    KEY_BYTES,
    BlockKey,
    Namespace,
    PrefixKeyCache,
    PresentPrefixCache,
)
from dualpath_cli.core.pe_fetch import classify_pe, pick_pe
from dualpath_cli.core.policies import SchedParams, charge_read, get_policy, read_plan
from dualpath_cli.core.types import EngineSnapshot, Request, Role
from dualpath_cli.errors import NoAvailableEngine, UsageError
from dualpath_cli.runtime.control import SchedulerChange, Settings, check_change
from dualpath_cli.runtime.decisions import DecisionLog
from dualpath_cli.runtime.gctune import pace_gc_for_scheduler
from dualpath_cli.runtime.ledger import Lookup, RequestLedger
from dualpath_cli.runtime.options import DEFAULT_BATCH_WINDOW_S
from dualpath_cli.runtime.readmodel import EngineWindow, Rate, engine_view, node_view
from dualpath_cli.runtime.wire import (
    Cancel,
    Done,
    Fetch,
    First,
    GroupLeader,
    Heartbeat,
    Hello,
    KeyArray,
    Lead,
    MetricsRequest,
    Prefill,
    QueueReport,
    ReadFailed,
    SetQuota,
    Stop,
    TokenArray,
    WireError,
    WireMessage,
    decode,
    encode,
)
from dualpath_cli.storage import KVStore
from dualpath_cli.storage.store import removal_generation
from dualpath_cli.telemetry.frames import expand_frame, is_frame
from dualpath_cli.telemetry.registry import Histogram, MetricsRegistry
from dualpath_cli.telemetry.view import (
    Decision,
    EngineView,
    LatencyHistogram,
    NodeView,
    SchedulerView,
    Thresholds,
)
from dualpath_cli.transfer.base import Fabric, Message

__all__ = ["ENGINE_STATES", "SchedulerChange", "TurnRequest", "TurnResult",
           "Latch", "Ticket", "EngineState", "SchedulerService"]

log = logging.getLogger(__name__)

_NO_KEYS = KeyArray([])  # a turn's keys before its lookup (read-only: shared)
_NO_PROMPT = TokenArray([])  # a turn's prompt frame before its lookup (read-only: shared)
_HEAD = 8  # queue-head request ids kept in a decision's inputs

#: States an engine is in, as the scheduler sees it.
ENGINE_STATES: tuple[str, ...] = ("starting", "ready", "dead", "left")


@dataclass
class TurnRequest:
    """One agent turn: the full prompt (context + appended tokens) and tokens to generate."""

    agent: int
    turn: int
    tokens: np.ndarray
    gen: int


@dataclass
class TurnResult:
    """What came back for a turn, with its timeline (monotonic seconds)."""

    tokens: list[int]
    submitted: float
    first_at: float
    done_at: float
    cached: int
    attempts: int
    pe: int
    de: int
    pe_tokens: int
    rx_from_pe: int
    second_at: float = 0.0


class Latch:
    """A one-shot :class:`threading.Event` (``set``, ``is_set``, ``wait``) made of one lock.

    Why: every turn's ticket holds two; an ``Event`` builds a ``Condition`` in Python (a
    lock, a deque, bound methods), a few microseconds per turn at 2,400 turns/s on the
    scheduler's thread. Here the lock is held from creation until :meth:`set`; a waiter
    acquires it (blocking) and hands it straight back.
    """

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        try:
            self._lock.release()
        except RuntimeError:  # a racing set() released it first
            pass

    def wait(self, timeout: float | None = None) -> bool:
        """True once set; False if ``timeout`` seconds passed first."""
        if self._set:
            return True
        if self._lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            try:
                self._lock.release()
            except RuntimeError:  # two racing set() calls released it under us
                pass
            return True
        return self._set


# the most messages one batch handles before the loop looks at its timers again (a burst
# bigger than this is handled in several passes, without the wait between them)
_BATCH_MAX = 512


class Ticket:
    """A handle to wait on a turn's result."""

    def __init__(self) -> None:
        self.event = Latch()
        self.result: TurnResult | None = None
        self.first_event = Latch()
        self.error: Exception | None = None
        self._callbacks: list[Callable[[], None]] = []
        self._callbacks_lock = threading.Lock()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once the turn is done (at once if it already is).

        It runs on the thread that finishes the turn, often with the scheduler's lock held,
        so it must be quick, must not raise and must take no lock a submitter may hold
        while it waits for the scheduler (hand the work to another thread instead). Why: an
        event loop waiting on a turn then needs no thread of its own blocked in
        :meth:`wait` (each thread hand-off is a wake-up on the request's critical path).
        """
        with self._callbacks_lock:
            if not self.event.is_set():
                self._callbacks.append(fn)
                return
        fn()

    def finish(self) -> None:
        """Mark the turn done (its ``result`` or ``error`` is set): wake waiters, run callbacks."""
        self.first_event.set()
        with self._callbacks_lock:
            self.event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn()
            except Exception:  # a waiter's bug must not stop the scheduler
                log.exception("a turn's done callback failed")

    def wait(self, timeout: float | None = None) -> TurnResult:
        """Block until the turn is done; raises the error it was failed with, if any."""
        if not self.event.wait(timeout):
            raise TimeoutError("turn did not finish in time")
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result

    def fail(self, error: Exception) -> None:
        """Answer the turn with ``error`` instead of a result (a stopping cluster cut it off)."""
        self.error = error
        self.finish()


class _Charges:
    """An engine's pending read charges (dispatch seq -> tokens) and their sum.

    Why the sum is kept: every snapshot of every engine of a node reads it (a node's read
    queue), several per dispatch; adding and retiring charges are one per dispatch."""

    __slots__ = ("_by_seq", "total")

    def __init__(self) -> None:
        self._by_seq: dict[int, int] = {}
        self.total = 0

    def __len__(self) -> int:
        return len(self._by_seq)

    def add(self, seq: int, tokens: int) -> None:
        self._by_seq[seq] = tokens
        self.total += tokens

    def drop(self, seq: int) -> None:
        self.total -= self._by_seq.pop(seq, 0)

    def retire_through(self, seen: int) -> None:
        """Drop the charges of dispatches up to ``seen`` (a report counted them)."""
        if self._by_seq:
            for seq in [s for s in self._by_seq if s <= seen]:
                self.total -= self._by_seq.pop(seq)

    def clear(self) -> None:
        self._by_seq.clear()
        self.total = 0


@dataclass
class EngineState:
    """What the service knows about one engine."""

    engine_id: int
    role: str
    node: int
    group: int
    address: str = ""
    pid: int = 0
    last_seen: float = 0.0
    alive: bool = True
    dead_why: str = ""  # "exited" (the cluster saw it go), "silent" (heartbeat timeout), "left"
    orphans: set[int] = field(default_factory=set)  # requests re-queued away from it
    hb: Heartbeat | None = None  # the last heartbeat
    hb_at: float = 0.0  # when it arrived (monotonic)
    metrics: dict[str, Any] = field(default_factory=dict)
    metrics_at: float = 0.0
    rq: int = 0  # tokens in the node loader's queue, as last reported
    rq_n: int = 0  # order of that report
    seen: int = -1  # last dispatch sequence that report counted
    next_seq: int = 0
    charges: _Charges = field(default_factory=_Charges)  # reads dispatched, not yet reported
    snic_rate: Rate = field(default_factory=Rate)  # storage-NIC read bytes/s
    cnic_rate: Rate = field(default_factory=Rate)  # compute-NIC transmit bytes/s
    compute: EngineWindow = field(default_factory=EngineWindow)  # busy, service time, KV wait
    gpu_rate: Rate = field(default_factory=Rate)  # busy seconds per second (utilisation)

    @property
    def read_q(self) -> int:
        """Reported queue plus the reads dispatched since (the scheduler's view)."""
        return self.rq + self.charges.total

    @property
    def state(self) -> str:
        """``starting`` (no hello yet), ``ready``, ``dead``, or ``left`` (its node left)."""
        if not self.alive:
            return "left" if self.dead_why == "left" else "dead"
        return "ready" if self.address else "starting"

    @property
    def report(self) -> dict[str, Any]:
        """The last heartbeat as a plain dict (counters by name) plus ``received``."""
        if self.hb is None:
            return {}
        out = {f.name: getattr(self.hb, f.name) for f in dataclasses.fields(self.hb)
               if f.name != "metrics"}
        out["received"] = self.hb_at
        return out


class _RoutePass:
    """One DE phase-1 routing pass, shared by the turns it routed: the queue's head, every
    live group's load before the pass and each turn's (group, tokens) in routing order.
    Why: a turn's decision shows the loads just before its routing; a copy of every
    group's load per turn (96 groups at 48P96D) cost more than the routing, so it is made
    only when the decision is read."""

    __slots__ = ("head", "base", "steps")

    def __init__(self, head: list[int], base: dict[int, int]) -> None:
        self.head = head
        self.base = base
        self.steps: list[tuple[int, int]] = []

    def route(self, i: int) -> dict[str, Any]:
        """The ``i``-th routed turn's phase-1 inputs and outcome (``de_route``)."""
        loads = dict(self.base)
        for g, tokens in itertools.islice(self.steps, i):
            loads[g] += tokens
        return {"queue_head": self.head, "group_loads": loads, "group": self.steps[i][0]}


class _Routed(NamedTuple):
    """A turn's place in a :class:`_RoutePass`."""

    routing: _RoutePass
    at: int  # its index in the pass's steps

    def as_dict(self) -> dict[str, Any]:
        return self.routing.route(self.at)


@dataclass
class _Flight:
    rid: int
    req: TurnRequest
    ticket: Ticket
    submitted: float
    att: int = 0
    cached: int = 0
    keys: KeyArray = field(default_factory=lambda: _NO_KEYS)  # the hit blocks' keys
    prompt: TokenArray = field(default_factory=lambda: _NO_PROMPT)  # int32, by the lookup
    generation: Hashable | None = None  # the store's removal generation at the lookup
    max_hit_blocks: int | None = None
    pe: int = -1
    de: int = -1
    de_group: int = -1
    pe_tokens: int = 0
    charges: list[tuple[int, int]] = field(default_factory=list)  # (engine, dispatch seq)
    prefilled: bool = False
    first_at: float = 0.0
    route: _Routed | None = None  # DE phase-1 inputs and outcome
    place: dict[str, Any] = field(default_factory=dict)  # DE phase-2 inputs and outcome


class _EngineTable(dict[int, EngineState]):
    """The scheduler's engines by id; ``version`` counts the entries set or removed, so an
    index built over them (by group, by node) knows when it must be rebuilt, whoever set
    an entry (``register``, a checkpoint's restore)."""

    version = 0

    def __setitem__(self, key: int, value: EngineState) -> None:
        super().__setitem__(key, value)
        self.version += 1

    def __delitem__(self, key: int) -> None:
        super().__delitem__(key)
        self.version += 1

    def pop(self, *args: Any) -> Any:
        self.version += 1
        return super().pop(*args)

    def clear(self) -> None:
        super().clear()
        self.version += 1

    def update(self, *args: Any, **kw: Any) -> None:
        super().update(*args, **kw)
        self.version += 1


def _latency(h: Histogram) -> LatencyHistogram:
    """A histogram as the view carries it (finite bounds; ``count`` is the +Inf bucket)."""
    cumulative = h.cumulative()
    return LatencyHistogram(h.count, h.sum, tuple(zip(h.bounds, cumulative, strict=False)))


#: role name -> Role, and back: an Enum call or ``.value`` costs a microsecond per snapshot
_ROLES: dict[str, Role] = {r.value: r for r in Role}
_ROLE_NAMES: dict[Role, str] = {r: r.value for r in Role}


#: an engine snapshot's values at a PE decision, kept until the decision is read
_SnapRow = tuple[int, Role, int, int, int, int, int, int]
#: fields of a packed engine snapshot (:func:`_pack_rows`)
_ROW_FIELDS = 8
_ROLE_ORDER: tuple[Role, ...] = tuple(Role)


def _snap_row(e: EngineSnapshot) -> _SnapRow:
    return (e.engine_id, e.role, e.node, e.group, e.seq, e.tok, e.read_q, e.hbm_free)


def _row_dict(r: _SnapRow) -> dict[str, Any]:
    """A snapshot as a decision's inputs show it."""
    return {"id": r[0], "role": _ROLE_NAMES[r[1]], "node": r[2], "group": r[3], "seq": r[4],
            "tok": r[5], "read_q": r[6], "hbm_free": r[7]}


def _pack_rows(snaps: Iterable[EngineSnapshot]) -> array.array[int]:
    """Snapshots as one flat int64 array, ``_ROW_FIELDS`` a snapshot (the role as its
    index). Why: a DE placement's snapshots are kept (a dict each, before) until the ring
    drops the last decision of the turns it placed, ~10,000 decisions later, and each
    object was then freed from a cold cache line. (A PE decision's tuples are cheaper to
    make than to pack: kept as they are.)"""
    index = _ROLE_ORDER.index
    return array.array("q", [v for e in snaps for v in (
        e.engine_id, index(e.role), e.node, e.group, e.seq, e.tok, e.read_q, e.hbm_free)])


def _row_dicts(flat: array.array[int]) -> list[dict[str, Any]]:
    """:func:`_pack_rows`' snapshots as a decision's inputs show them."""
    rows = flat.tolist()
    return [_row_dict((rows[i], _ROLE_ORDER[rows[i + 1]], rows[i + 2], rows[i + 3],
                       rows[i + 4], rows[i + 5], rows[i + 6], rows[i + 7]))
            for i in range(0, len(rows), _ROW_FIELDS)]


def _pe_fetch_inputs(head: list[int], pes: list[_SnapRow], de: _SnapRow,
                     flight: dict[str, Any], look: Lookup | None) -> dict[str, Any]:
    """A PE fetch decision's inputs, built when the decision is first read (``flight``:
    its route, placement, ordinal, thresholds and their sources, as they were)."""
    route, place = flight["de_route"], flight["de_place"]
    if "engines" in place:  # the DE group's snapshots, packed when it was placed
        place = {**place, "engines": _row_dicts(place["engines"]),
                 "queue_head": place["queue_head"].tolist()}
    return {"pe_queue_head": head, "pe_engines": [_row_dict(r) for r in pes],
            "de_engine": _row_dict(de), **flight, "de_place": place,
            "sources": dict(flight["sources"]),
            "de_route": route.as_dict() if route is not None else {},
            "lookup": look.as_dict() if look is not None else {}}


class SchedulerService:
    """The launcher-side scheduler. See the module docstring.

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
                 prefix_cache_tokens: int = 32 << 20,
                 quota_s: float = 0.3, sources: Mapping[str, str] | None = None,
                 layerwise_prefill: bool = True, controllers: Mapping[str, bool] | None = None,
                 control_interval_s: float = 1.0, snic_bw: float = 0.0,
                 batch_window_s: float = DEFAULT_BATCH_WINDOW_S) -> None:
        pace_gc_for_scheduler()  # its process allocates per turn: collect in fewer passes
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
        self.engines: dict[int, EngineState] = _EngineTable()
        self.queue: collections.deque[_Flight] = collections.deque()  # global FIFO
        #: (role, group) -> the engine that fetches for it (the last one seen fetching)
        self._fetchers: dict[tuple[str, int], int] = {}
        #: (role, group) -> the leader its engines were told to send queue reports to
        self._report_to: dict[tuple[str, int], int] = {}
        self.private: dict[int, collections.deque[_Flight]] = collections.defaultdict(
            collections.deque)  # DE group -> routed, not yet placed
        self.pe_queue: collections.deque[_Flight] = collections.deque()  # placed, need a PE
        self.flights: dict[int, _Flight] = {}
        self.registry = MetricsRegistry()
        """Scheduler-side metrics (TTFT/TPOT, decisions, requeues, engines by state)."""
        self.log = DecisionLog(decision_ring, self.registry, decision_log)
        self.ledger = RequestLedger(self.registry, namespace, outcomes=decision_ring)
        """Why each request's blocks missed, and finished requests' timelines (explain)."""
        self.dead_events: list[tuple[int, float]] = []
        self.requeued = 0
        self.revived = 0
        self.bad_messages = 0
        # each kind an engine sends the scheduler -> its handler (other kinds: seen only)
        self._handlers: dict[type, Callable[[EngineState, Any, float], None]] = {
            Hello: self._on_hello, QueueReport: self._on_report, Heartbeat: self._on_heartbeat,
            Fetch: self._on_fetch, First: self._on_first, Done: self._on_done,
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

    # -- public API ---------------------------------------------------------------------
    def register(self, engine_id: int, role: str, node: int, group: int) -> None:
        """Declare an engine before it starts (its address comes with ``hello``)."""
        with self._lock:
            self.engines[engine_id] = EngineState(engine_id, role, node, group,
                                                  last_seen=time.monotonic())
            self._count_engines()

    def start(self) -> None:
        """Start the service thread."""
        self._thread.start()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until every registered engine has said hello."""
        deadline = time.monotonic() + timeout
        with self._registered:
            while not all(e.address for e in self.engines.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [e.engine_id for e in self.engines.values() if not e.address]
                    raise TimeoutError(f"engines {missing} did not start within {timeout} s")
                self._registered.wait(left)

    def all_hello(self) -> bool:
        """Whether every registered engine has said hello."""
        with self._lock:
            return all(e.address for e in self.engines.values())

    def submit(self, req: TurnRequest) -> Ticket:
        """Queue a turn; returns its ticket."""
        ticket = Ticket()
        with self._lock:
            rid = self._next_rid
            self._next_rid += 1
            flight = _Flight(rid, req, ticket, time.monotonic())
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

    def settings(self) -> Settings:
        """The values a :class:`SchedulerChange` acts on, as in force now."""
        with self._lock:
            return Settings(self.params.alpha, self.params.beta, self.quota_s, self.read_side,
                            {name: bool(self.controllers.on.get(name)) for name in CONTROLLERS})

    def update(self, change: SchedulerChange) -> tuple[dict[str, Any], dict[str, Any]]:
        """Apply ``change``; returns ``(old, new)`` of the fields it set.

        Decisions after this one use the new values (and log them in their inputs); their
        source becomes ``api``. A new quota is sent to every live PE.

        Raises:
            UsageError: nothing to change, or a bad value (the message says which and why).
        """
        values = check_change(change, self.bt)
        if "read_side" in values:
            row = get_policy(values["read_side"])
            if row.shaped != self.shaped:
                raise UsageError(f"read_side: {row.name!r} "
                                 f"{'shapes' if row.shaped else 'does not shape'} the NICs, "
                                 "which is fixed at launch; choose a policy that "
                                 f"{'shapes' if self.shaped else 'does not shape'} them")
        with self._lock:
            before = self.settings().as_dict()
            params = self.params
            if "alpha_tokens" in values:
                params = dataclasses.replace(params, alpha=values["alpha_tokens"])
                self.sources["alpha"] = "api"
                self._rebase("alpha", values["alpha_tokens"])
            if "beta_tokens" in values:
                params = dataclasses.replace(params, beta=values["beta_tokens"])
                self.sources["beta"] = "api"
                self._rebase("beta", values["beta_tokens"])
            self.params = params
            if "read_side" in values:
                self.read_side = values["read_side"]
                self.policy = get_policy(self.read_side)
                self.sources["read_side"] = "api"
            if "quota_s" in values:
                self._set_quota(values["quota_s"], "api")
                self._rebase("quota", values["quota_s"])
            for name, key in CONFIG_KEYS.items():
                if key in values:
                    if values[key] and not self.controllers.on.get(name):
                        self._ctl_next = time.monotonic() + self.control_interval_s
                    self.controllers.on[name] = values[key]
            after = self.settings().as_dict()
        return {k: before[k] for k in values}, {k: after[k] for k in values}

    def _rebase(self, name: str, value: float) -> None:
        """An operator set ``name``: its controller starts from it, bounded around it."""
        self._ctl_values[name] = float(value)
        self.controllers.rebase(name, float(value))

    def _set_quota(self, quota_s: float, source: str) -> None:
        self.quota_s = quota_s
        self.sources["quota"] = source
        for e in self.engines.values():
            if e.alive and e.address and e.role == Role.PREFILL.value:
                self._send(e.address, SetQuota(self.quota_s))

    # -- dynamic controllers ------------------------------------------------------------
    def control_signals(self) -> dict[str, float | None]:
        """What the controllers see now: the busiest storage NIC's utilisation, the PEs'
        mean GPU utilisation (heartbeat windows) and the TTFT tail of the turns finished
        since the last step (``None``: not measured)."""
        with self._lock:
            return self._signals(consume=False)

    def _signals(self, consume: bool) -> dict[str, float | None]:
        by_node: dict[int, list[float | None]] = collections.defaultdict(list)
        gpu: list[float] = []
        for e in self.engines.values():
            if not e.alive or e.hb is None:
                continue
            by_node[e.node].append(e.snic_rate.rate)
            if e.role == Role.PREFILL.value and e.gpu_rate.rate is not None:
                gpu.append(min(1.0, e.gpu_rate.rate))
        snic: float | None = None
        if self.snic_bw > 0 and by_node:
            utils = [sum(r for r in rates if r is not None)
                     / (self.snic_bw * self.snic_scale.get(node, 1.0))
                     for node, rates in by_node.items() if any(r is not None for r in rates)]
            snic = max(utils) if utils else None
        tail = ttft_tail(self._ttfts)
        if consume:
            self._ttfts = []
        return {"snic_util": snic, "gpu_util": sum(gpu) / len(gpu) if gpu else None,
                "ttft_tail": tail}

    def _control(self, now: float) -> list[ControlStep]:
        """One controller interval: measure, step core's controllers, apply and log moves."""
        self._ctl_next = now + self.control_interval_s
        signals = self._signals(consume=True)
        steps = self.controllers.step(self._ctl_values, signals)
        for step in steps:
            if not step.moved:
                continue
            self._ctl_values[step.name] = step.new
            if step.name == "alpha":
                self.params = dataclasses.replace(self.params, alpha=int(round(step.new)))
                self.sources["alpha"] = "controller"
            elif step.name == "beta":
                self.params = dataclasses.replace(self.params, beta=int(round(step.new)))
                self.sources["beta"] = "controller"
            else:
                self._set_quota(step.new, "controller")
            self.log.record_control(
                at=time.time(), name=step.name, inputs={
                    **step.to_dict(), "signals": dict(signals),
                    "alpha": self.params.alpha, "beta": self.params.beta,
                    "quota_s": self.quota_s, "interval_s": self.control_interval_s})
        return steps

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

    def _count_engines(self) -> None:
        for role in (Role.PREFILL.value, Role.DECODE.value):
            counts = dict.fromkeys(ENGINE_STATES, 0)
            for e in self.engines.values():
                if e.role == role:
                    counts[e.state] += 1
            for state, n in counts.items():
                self.registry.gauge("dualpath_scheduler_engines", role=role, state=state).set(n)

    # -- prefix lookup ------------------------------------------------------------------
    def _lookup(self, f: _Flight) -> None:
        # the agent's last keys reused up to its first changed token: equal to prefix_keys
        got = self._prefix.prompt(f.req.agent, f.req.tokens)
        limit = (len(f.req.tokens) - 1) // self.bt  # always leave one token to prefill
        if f.max_hit_blocks is not None:
            limit = min(limit, f.max_hit_blocks)
        # blocks found present last turn at the same removal generation are not stat'ed again
        f.generation = removal_generation(self.store)
        hits = self._present.hits(f.req.agent, got.keys, limit, f.generation,
                                  self.store.contains)
        # the dispatch's frames, made once from what the lookup has: the uint32 tokens are
        # the int32 ones (token ids are under 2**31) and the hit keys a slice of the digests
        f.keys = KeyArray(np.frombuffer(got.raw, np.uint8, hits * KEY_BYTES)
                          .reshape(hits, KEY_BYTES))
        f.prompt = TokenArray(got.tokens.view(np.int32))
        f.cached = hits * self.bt
        self.ledger.lookup(f.rid, f.req.agent, got.raw, len(f.req.tokens), hits)

    # -- service loop -------------------------------------------------------------------
    def _send(self, to: str, msg: WireMessage) -> None:
        header, frames = encode(msg)
        self.ep.send(to, header, frames)

    def _loop(self) -> None:
        next_check = 0.0
        self._cpu_at = time.thread_time()
        window = self.batch_window_s
        while not self._stop.is_set():
            raw = self.ep.recv(timeout=0.05)
            drained = False
            with self._lock:
                n = 0
                while raw is not None:  # what is waiting, in one pass (a batch)
                    self.on_message(raw)
                    n += 1
                    if not window or n >= _BATCH_MAX:
                        break
                    raw = self.ep.recv(timeout=0)
                else:
                    drained = n > 0
                now = time.monotonic()
                if now >= next_check:  # a pass over every engine: not once per message
                    self.on_sweep()
                    next_check = now + min(0.05, self.hb_timeout / 10)
                if self.controllers.any_on:
                    now = time.monotonic()
                    if now >= self._ctl_next:
                        self._control(now)
            if drained:  # let the next messages gather (not after a full batch: busy)
                time.sleep(window)

    def _sweep(self) -> None:
        """The loop's periodic pass: silent engines, and the cost sample."""
        self._check_heartbeats()
        self._sample_cost()

    def _sample_cost(self) -> None:
        """Move the timed scheduling calls into their histograms and count the service
        thread's CPU since the last sample (on that thread, once per sweep)."""
        for kind, times in (("pe_fetch", self._pe_fetch_s), ("de_fetch", self._de_fetch_s)):
            if times:
                self._m_decide[kind].observe_many(times)
                times.clear()
        cpu = time.thread_time()
        self._m_cpu.inc(max(0.0, cpu - self._cpu_at))
        self._cpu_at = cpu

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        for e in list(self.engines.values()):
            if e.alive and e.address and now - e.last_seen > self.hb_timeout:
                self._dead(e.engine_id, "silent")

    def _handle(self, raw: Message) -> None:
        try:
            msg = decode(raw.header, raw.buffers)
        except WireError as err:
            self.bad_messages += 1
            log.warning("scheduler: dropped a message: %s", err)
            return
        eid = getattr(msg, "eid", None)
        e = self.engines.get(eid) if isinstance(eid, int) else None
        if e is None:
            return
        if not e.alive:
            if e.dead_why != "silent" or type(msg) not in (Heartbeat, QueueReport):
                return
            self._revive(e)
        now = time.monotonic()
        e.last_seen = now
        handler = self._handlers.get(type(msg))  # by kind: one lookup, not a chain of tests
        if handler is not None:
            handler(e, msg, now)

    def _on_hello(self, e: EngineState, msg: Hello, now: float) -> None:
        e.address, e.pid = msg.addr, msg.pid
        self._live_version += 1
        self._count_engines()
        self._registered.notify_all()
        leader = self.engines.get(self._report_to.get((e.role, e.group), -1))
        if leader is e:  # the leader came back (a new process): at a new address
            self._announce_leader(e)
        elif leader is not None and leader.alive and leader.address:
            self._send(e.address, GroupLeader(e.group, leader.address))  # a late member

    def _on_report(self, e: EngineState, msg: QueueReport, now: float) -> None:
        self._on_queue_report(e, msg)

    def _announce_leader(self, leader: EngineState) -> None:
        """Tell ``leader``'s group to send their queue reports to it (paper 6.1: they ride
        on its fetches, not a message each to the scheduler)."""
        self._report_to[(leader.role, leader.group)] = leader.engine_id
        told = GroupLeader(leader.group, leader.address)
        for m in self._live_members(leader.role).get(leader.group, ()):
            if m is not leader:
                self._send(m.address, told)

    def _group_reports(self, e: EngineState, reports: tuple[tuple[int, ...], ...]) -> None:
        """The queue reports a leader's fetch carries: each applied as if its engine had
        sent it (the newest wins by ``n``); one of another group, a dead engine's or a
        malformed one is dropped."""
        engines = self.engines
        for r in reports:
            try:
                eid, n, seen, rq = r
                m = engines.get(eid)
            except (TypeError, ValueError):
                m = None
            if m is None or m.group != e.group or m.role != e.role or not (
                    type(n) is int and type(seen) is int and type(rq) is int):
                self.bad_messages += 1
                continue
            if m.alive:
                self._take_report(m, n, seen, rq)

    def _on_heartbeat(self, e: EngineState, msg: Heartbeat, now: float) -> None:
        self._on_queue_report(e, msg)
        if msg.metrics is not None:
            e.metrics, e.metrics_at = msg.metrics, now
        e.hb, e.hb_at = msg, now
        e.snic_rate.update(now, msg.snic_read_bytes)
        e.gpu_rate.update(now, msg.busy_s)
        e.cnic_rate.update(now, msg.cnic_tx_bytes)
        e.compute.update(now, msg)
        self._registered.notify_all()

    def _on_fetch(self, e: EngineState, msg: Fetch, now: float) -> None:
        """A fetch that finds work is a decision: timed. Its group's queue reports are
        taken first, so the decision sees them."""
        key = (e.role, e.group)
        self._fetchers[key] = e.engine_id
        if msg.reports:
            self._group_reports(e, msg.reports)
        told = self.engines.get(self._report_to.get(key, -1))
        if told is None or not told.alive:  # the group's first fetch, or its leader died
            self._announce_leader(e)
        if e.role == Role.PREFILL.value:
            if self.pe_queue:
                t0 = time.perf_counter()
                self._pe_fetch(e.group)
                self._pe_fetch_s.append(time.perf_counter() - t0)
        elif self.queue or self.private.get(e.group):
            t0 = time.perf_counter()
            self._de_fetch(e.group)
            self._de_fetch_s.append(time.perf_counter() - t0)

    def _flight_of(self, msg: First | Done | ReadFailed) -> _Flight | None:
        """The flight ``msg`` reports on (``None``: gone, or a stale attempt)."""
        f = self.flights.get(msg.rid)
        return f if f is not None and f.att == msg.att else None

    def _on_first(self, e: EngineState, msg: First, now: float) -> None:
        f = self._flight_of(msg)
        if f is not None:
            self._load_delta(f, -1, de=False)  # its PE's part ends; its DE's stays
            f.prefilled = True
            f.first_at = msg.at
            self.ledger.first(f.rid, msg.facts)
            f.ticket.first_event.set()

    def _on_done(self, e: EngineState, msg: Done, now: float) -> None:
        f = self._flight_of(msg)
        if f is not None:
            self._finish(f, msg)

    def _on_read_failed(self, e: EngineState, msg: ReadFailed, now: float) -> None:
        f = self._flight_of(msg)
        if f is not None:
            if msg.block >= 0:
                self.ledger.failed(f.rid, msg.block, msg.why, f.keys)
            self._requeue(f, "read_failed", max_hit=msg.block if msg.block >= 0 else None)

    def _on_queue_report(self, e: EngineState, m: QueueReport | Heartbeat) -> None:
        self._take_report(e, m.n, m.seen, m.rq)

    @staticmethod
    def _take_report(e: EngineState, n: int, seen: int, rq: int) -> None:
        """``e``'s read queue as a report says (sent by itself, or carried on its leader's
        fetch), unless a newer one was taken already; retires the charges it counts."""
        if n <= e.rq_n:
            return  # an older report overtaken by a newer one
        e.rq_n, e.rq, e.seen = n, rq, seen
        e.charges.retire_through(seen)

    def _finish(self, f: _Flight, m: Done) -> None:
        self._load_delta(f, -1)
        del self.flights[f.rid]
        self._drop_charges(f)
        tokens = list(m.tokens)  # (a tuple of ints: the ledger converts it once)
        chain = self.ledger.finished(f.rid, f.req.agent, m.tokens, f.req.tokens, {
            "submitted": f.submitted, "first_at": f.first_at or None, "done_at": m.at,
            "second_at": m.second_at or None, "attempts": f.att + 1, "cached": f.cached,
            "pe_tokens": f.pe_tokens, "rx_from_pe": m.rx_from_pe, "de": m.facts})
        # the blocks the DE says are stored need no stat at the agent's next lookup, while
        # the store removes nothing (the generation read before they were written)
        stored = min(m.stored, len(chain) // KEY_BYTES)
        if stored > 0:
            self._present.note(f.req.agent, f.generation, stored,
                               BlockKey(chain[(stored - 1) * KEY_BYTES:stored * KEY_BYTES]))
        f.ticket.result = TurnResult(tokens, f.submitted, f.first_at, m.at, f.cached,
                                     f.att + 1, f.pe, f.de, f.pe_tokens, m.rx_from_pe,
                                     m.second_at)
        if f.first_at > 0:
            self._m_ttft.observe(max(0.0, f.first_at - f.submitted))
            if self.controllers.on.get("quota"):
                self._ttfts.append(max(0.0, f.first_at - f.submitted))
            if len(tokens) > 1:
                self._m_tpot.observe(max(0.0, (m.at - f.first_at) / (len(tokens) - 1)))
        f.ticket.finish()

    def _drop_charges(self, f: _Flight) -> None:
        for eid, seq in f.charges:
            e = self.engines.get(eid)
            if e is not None:
                e.charges.drop(seq)
        f.charges.clear()

    def _requeue(self, f: _Flight, reason: str, max_hit: int | None = None) -> None:
        for eid in (f.pe, f.de):
            e = self.engines.get(eid)
            if e is not None and e.alive and e.address:
                self._send(e.address, Cancel(f.rid, f.att))
        self._drop_charges(f)
        if f in self.pe_queue:
            self.pe_queue.remove(f)
        for g, q in self.private.items():
            if f in q:
                q.remove(f)
                self._routed_tok[g] -= len(f.req.tokens)
                self._group_load_add(g, -len(f.req.tokens))
        f.att += 1
        self._load_delta(f, -1)
        f.pe = f.de = f.de_group = -1
        f.prefilled = False
        f.route, f.place = None, {}
        if max_hit is not None:
            f.max_hit_blocks = max_hit
        self._lookup(f)
        self.queue.appendleft(f)
        self.requeued += 1
        self.registry.counter("dualpath_scheduler_requeued_turns_total", reason=reason).inc()

    def _dead(self, engine_id: int, why: str) -> None:
        """Take an engine out of scheduling and re-queue its requests.

        ``why`` is ``exited`` (its process is gone: for good) or ``silent`` (no heartbeat
        within the timeout: a stalled engine comes back with its next report, see
        :meth:`_revive`).
        """
        e = self.engines.get(engine_id)
        if e is None:
            return
        if not e.alive:
            if why in ("exited", "left"):
                e.dead_why = why  # a silent engine that then exited never comes back
            return
        e.alive = False
        e.dead_why = why
        self._live_version += 1
        e.charges.clear()
        self.dead_events.append((engine_id, time.monotonic()))
        for f in [f for f in self.flights.values() if engine_id in (f.pe, f.de)]:
            e.orphans.add(f.rid)
            self._requeue(f, "engine_dead")
        if e.role == Role.DECODE.value and not any(
                x.alive for x in self.engines.values() if x.group == e.group):
            stranded = self.private.pop(e.group, collections.deque())
            self._routed_tok.pop(e.group, None)
            self._group_loads = None
            self.queue.extendleft(reversed(stranded))
        self._promote_fetcher(e)
        self._count_engines()

    def _promote_fetcher(self, dead: EngineState) -> None:
        """If ``dead`` fetched for its group (or none was seen yet), make the group's next
        live engine its fetcher (``lead``): fetching is pull-based, so a group whose only
        fetcher died would never be offered work again while its other GPUs idle."""
        key = (dead.role, dead.group)
        if self._fetchers.get(key, dead.engine_id) != dead.engine_id:
            return
        heirs = sorted(x.engine_id for x in self.engines.values() if x.alive and x.address
                       and x.role == dead.role and x.group == dead.group)
        if not heirs:
            self._fetchers.pop(key, None)
            return
        heir = self.engines[heirs[0]]
        self._fetchers[key] = heir.engine_id
        self._announce_leader(heir)  # reports sent to the dead leader are lost till then
        log.warning("scheduler: engine %d now fetches for %s group %d (engine %d, its "
                    "fetcher, is dead)", heir.engine_id, dead.role, dead.group,
                    dead.engine_id)
        self._send(heir.address, Lead(dead.group))

    def _revive(self, e: EngineState) -> None:
        """A silent engine reported again: cancel the work it held (re-queued meanwhile)
        before it is offered new work, and schedule on it again."""
        log.warning("scheduler: engine %d reported again after being declared dead (no "
                    "heartbeat for %.1f s); back in service", e.engine_id,
                    time.monotonic() - e.last_seen)
        for rid in sorted(e.orphans):
            self._send(e.address, Cancel(rid))
        e.orphans.clear()
        e.alive, e.dead_why = True, ""
        self._live_version += 1
        self.revived += 1
        self._count_engines()

    # -- scheduling ---------------------------------------------------------------------
    def _request(self, f: _Flight) -> Request:
        return Request(f.rid, len(f.req.tokens), f.cached)

    def _loads(self) -> tuple[dict[int, int], dict[int, int], dict[int, int]]:
        """Per engine: unfinished requests (seq), their tokens (tok) and DE HBM held,
        counted from the turns in flight (what :meth:`_load_delta` keeps up to date)."""
        seq: dict[int, int] = collections.defaultdict(int)
        tok: dict[int, int] = collections.defaultdict(int)
        hbm_used: dict[int, int] = collections.defaultdict(int)
        for f in self.flights.values():
            if f.pe >= 0 and not f.prefilled:
                seq[f.pe] += 1
                tok[f.pe] += len(f.req.tokens)
            if f.de >= 0:
                seq[f.de] += 1
                tok[f.de] += len(f.req.tokens)
                hbm_used[f.de] += len(f.req.tokens) + f.req.gen
        return seq, tok, hbm_used

    def _load_delta(self, f: _Flight, sign: int, de: bool = True) -> None:
        """Add (``sign`` 1) or take away (-1) turn ``f``'s share of its engines' loads.

        Why: a fetch used to count every turn in flight (thousands at the paper's rate);
        every change of a turn's ``pe``, ``de`` or ``prefilled`` is bracketed by -1 and +1
        here instead, so the counts always equal :meth:`_loads`. Code that changes
        ``flights`` another way (a restore) calls :meth:`_recount_loads` after.
        """
        n = len(f.req.tokens)
        if f.pe >= 0 and not f.prefilled:
            self._seq[f.pe] += sign
            self._tok[f.pe] += sign * n
        if de and f.de >= 0:  # (``de`` False: a caller changing only the PE's part)
            self._seq[f.de] += sign
            self._tok[f.de] += sign * n
            self._hbm_used[f.de] += sign * (n + f.req.gen)
            group = self.engines[f.de].group
            self._de_group_tok[group] += sign * n
            self._group_load_add(group, sign * n)

    def _group_load_add(self, group: int, delta: int) -> None:
        """Move DE group ``group``'s kept phase-1 load by ``delta`` (what its ``tok`` or
        routed tokens moved by): every change of either goes through here or drops the
        kept loads, so they always equal the sum a fetch used to make over every group."""
        loads = self._group_loads
        if loads is not None and delta:
            try:
                loads.add(group, delta)
            except KeyError:  # not a live group: the loads are rebuilt when it is one
                pass

    def _recount_loads(self) -> None:
        """Set the kept loads from the turns in flight (after ``flights`` changed in bulk)."""
        self._group_loads = None
        self._seq, self._tok, self._hbm_used = self._loads()
        self._de_group_tok = collections.defaultdict(int)
        self._routed_tok = collections.defaultdict(int)
        for g, q in self.private.items():
            self._routed_tok[g] = sum(len(f.req.tokens) for f in q)
        for eid, tok in self._tok.items():
            e = self.engines.get(eid)
            if e is not None and e.role == Role.DECODE.value:
                self._de_group_tok[e.group] += tok

    def _members(self) -> tuple[dict[str, dict[int, list[EngineState]]],
                                dict[int, list[EngineState]]]:
        """Engines by role and group, and by node, in registration order (rebuilt when an
        engine is set in :attr:`engines`): a fetch reads its own group, not all 1,152."""
        version = getattr(self.engines, "version", -1)
        if version < 0 or self._index_n != version:
            by_group: dict[str, dict[int, list[EngineState]]] = {
                Role.PREFILL.value: {}, Role.DECODE.value: {}}
            by_node: dict[int, list[EngineState]] = {}
            for e in self.engines.values():
                by_group.setdefault(e.role, {}).setdefault(e.group, []).append(e)
                by_node.setdefault(e.node, []).append(e)
            self._by_group, self._by_node = by_group, by_node
            self._index_n = version
        return self._by_group, self._by_node

    def _live_members(self, role: str) -> dict[int, list[EngineState]]:
        """``role``'s groups that have live engines which said hello, with those engines in
        registration order (cached until an engine registers, says hello, dies or returns).

        A group's ``tok`` is :attr:`_de_group_tok`: an engine that is dead or never said
        hello holds no turn (its turns are re-queued when it dies), so its live engines'
        tokens are all of the group's.
        """
        key = (self._live_version, getattr(self.engines, "version", -1))
        if key != self._live_key or key[1] < 0:
            live: dict[str, dict[int, list[EngineState]]] = {}
            for r, groups in self._members()[0].items():
                live[r] = {}
                for g, members in groups.items():
                    alive = [e for e in members if e.alive and e.address]
                    if alive:
                        live[r][g] = alive
            self._live, self._live_key = live, key
        return self._live.get(role, {})

    def _node_q(self, node: int) -> int:
        """The node's read queue: its live engines' reported queues plus pending charges."""
        return sum(e.read_q for e in self._members()[1].get(node, ()) if e.alive)

    def _snapshot(self, e: EngineState, node_q: dict[int, int]) -> EngineSnapshot:
        """``e`` as the core's functions see it (``node_q`` memoises the node's queue)."""
        q = node_q.get(e.node)
        if q is None:
            q = node_q[e.node] = self._node_q(e.node)
        eid = e.engine_id
        return EngineSnapshot(eid, e.node, e.group, _ROLES[e.role], self._seq.get(eid, 0),
                              self._tok.get(eid, 0), q,
                              self.hbm_tokens - self._hbm_used.get(eid, 0))

    def _group_snapshots(self, role: str, group: int, node_q: dict[int, int],
                         ) -> list[EngineSnapshot]:
        """Snapshots of the group's live engines that said hello, in registration order."""
        return [self._snapshot(e, node_q) for e in self._live_members(role).get(group, ())]

    def _de_fetch(self, group: int) -> None:
        """A DE group fetch: phase 1 over the global FIFO, phase 2 on this group's queue."""
        if not self.queue and not self.private.get(group):
            return
        de = Role.DECODE.value
        node_q: dict[int, int] = {}
        engines = self._group_snapshots(de, group, node_q)
        if not engines:
            return
        if self.queue:
            # every live DE group's load: its engines' tokens plus what is routed to it
            live = self._live_members(de)
            group_loads = self._group_loads
            if group_loads is None or self._group_loads_for is not live:
                # live groups changed (a new cached dict) or the loads were dropped (a
                # recount, a group gone): rebuilt, and every live group has a queue (the
                # view lists them)
                routed_tok, group_tok = self._routed_tok, self._de_group_tok
                group_loads = self._group_loads = GroupLoads(
                    {g: group_tok.get(g, 0) + routed_tok.get(g, 0) for g in live})
                self._group_loads_for = live
                for g in live:
                    self.private[g]  # noqa: B018
            head = [f.rid for f in itertools.islice(self.queue, _HEAD)]
            flights = list(self.queue)
            # each request's inputs: the loads just before its routing
            routing = _RoutePass(head, group_loads.as_dict())
            # on the kept loads: routing adds each turn's tokens to its group, as
            # _group_load_add would
            assignments = de_route_in_place([self._request(f) for f in flights], group_loads)
            self.queue.clear()
            for i, (f, (_, g)) in enumerate(zip(flights, assignments, strict=True)):
                f.route = _Routed(routing, i)
                routing.steps.append((g, len(f.req.tokens)))
                self.private[g].append(f)
                self._routed_tok[g] += len(f.req.tokens)
        private = self.private[group]
        if not private:
            return
        before = _pack_rows(engines)
        place_head = array.array("q", [f.rid for f in itertools.islice(private, _HEAD)])
        queue = [self._request(f) for f in private]
        res = de_place(queue, engines, self.params.z_factor)
        classes = placement_classes(queue, [e for e in engines if e.healthy],
                                    res.assignments, res.z)
        for (_, de_id), cls in zip(res.assignments, classes, strict=True):
            f = private.popleft()
            self._routed_tok[group] -= len(f.req.tokens)
            self._group_load_add(group, -len(f.req.tokens))
            if f.pe >= 0 or f.de >= 0:  # (a routed turn has neither yet)
                self._load_delta(f, -1)
            f.de, f.de_group = de_id, group
            self._load_delta(f, 1)
            f.place = {"queue_head": place_head, "engines": before, "z": res.z,
                       "r_count": res.r_count, "stop": res.stop_reason, "de": de_id,
                       "de_class": cls.value}
            self.pe_queue.append(f)

    def _pe_fetch(self, group: int) -> None:
        """A PE group fetch: the PE by Algorithm 1, then the read side, charged at once."""
        if not self.pe_queue:
            return
        node_q: dict[int, int] = {}
        pes = self._group_snapshots(Role.PREFILL.value, group, node_q)
        if not pes:
            return
        # the DEs the queued turns were placed on, each as it stands when first needed: a
        # dispatch in this fetch changes only the read queues of the nodes it charges, which
        # charge_read below also adds to every snapshot already taken
        des: list[EngineSnapshot] = []
        de_by_id: dict[int, EngineSnapshot | None] = {}

        def de_snapshot(eid: int) -> EngineSnapshot | None:
            if eid not in de_by_id:
                e = self.engines.get(eid)
                snap = None
                if e is not None and e.alive and e.address and e.role == Role.DECODE.value:
                    snap = self._snapshot(e, {})
                    des.append(snap)
                de_by_id[eid] = snap
            return de_by_id[eid]

        head = [f.rid for f in itertools.islice(self.pe_queue, _HEAD)]
        params = self.params
        while self.pe_queue:
            f = self.pe_queue[0]
            de = de_snapshot(f.de)
            if de is None:  # its DE died meanwhile
                self._requeue(f, "engine_dead")
                continue
            request = self._request(f)
            # Algorithm 1 for the head request (pe_fetch of one request, whose copies of the
            # group cost more than the pick): the PE, then its load as assigned, adopted
            # once the read side is settled
            chosen = pick_pe(pes, params.alpha, params.beta)
            if chosen is None:
                return
            pe_id = chosen.engine_id
            pe_class = classify_pe(chosen, params.alpha, params.beta).label
            pe = chosen.copy()
            pe.tok += request.length
            pe.seq += 1
            de_before = _snap_row(de)
            try:
                plan = read_plan(self.policy, request, pe, de, params, self._ordinal)
            except NoAvailableEngine:
                return  # seed-select found neither side healthy: wait for the next fetch
            pes_before = [_snap_row(e) for e in pes]
            self.pe_queue.popleft()
            chosen.tok, chosen.seq = pe.tok, pe.seq
            pe_q, de_q = pe.read_q, de.read_q
            pe_tokens = plan.pe_tokens if self.shaped else f.cached
            de_tokens = f.cached - pe_tokens
            for node, tokens in ((pe.node, pe_tokens), (de.node, de_tokens)):
                charge_read(pes, node, tokens)
                charge_read(des, node, tokens)
            self._ordinal += 1
            self._dispatch(f, pe_id, de.engine_id, pe_tokens)
            side = plan.side.value if plan.side is not None else "split"
            self._record(f, side, pe_q, de_q, pe_class, functools.partial(
                _pe_fetch_inputs, head, pes_before, de_before, {
                    "de_route": f.route, "de_place": f.place, "ordinal": self._ordinal - 1,
                    "alpha": params.alpha, "beta": params.beta,
                    "z_factor": params.z_factor, "quota_s": self.quota_s,
                    "read_side": self.read_side, "sources": self._sources_kept()},
                self.ledger.last_lookup(f.rid)))

    def _dispatch(self, f: _Flight, pe: int, de: int, pe_tokens: int) -> None:
        whole = f.de != de  # the turn's DE is the one it was placed on: only the PE's part
        self._load_delta(f, -1, de=whole)
        f.pe, f.de, f.pe_tokens = pe, de, pe_tokens
        self._load_delta(f, 1, de=whole)
        self.ledger.dispatched(f.rid, len(f.req.tokens))
        pe_state, de_state = self.engines[pe], self.engines[de]
        seqs = {}
        for state, tokens in ((de_state, f.cached - pe_tokens), (pe_state, pe_tokens)):
            seq = seqs[state.engine_id] = state.next_seq
            state.next_seq += 1
            if tokens:
                state.charges.add(seq, tokens)
                f.charges.append((state.engine_id, seq))
        # the prompt after the hit (engines compute only those tokens; the hit's KV is
        # read) as one int32 frame and the keys as one frame of raw digests. One message:
        # the PE forwards the DE's part (the Decode) to it ahead of the turn's KV
        start = f.cached
        self._send(pe_state.address, Prefill(
            f.rid, f.att, seqs[pe], TokenArray(f.prompt.array[start:]), f.cached, f.keys,
            pe_tokens, de_state.address, self.layerwise, self.shaped, start, f.req.gen,
            seqs[de]))

    def _sources_kept(self) -> dict[str, str]:
        """The thresholds' sources as a decision keeps them: one copy, shared by every
        decision until they change (a copy a decision cost its allocation, and its free
        when the ring dropped the decision). Read only: the inputs copy it when built."""
        if self._sources_copy != self.sources:
            self._sources_copy = dict(self.sources)
        return self._sources_copy

    def _record(self, f: _Flight, side: str, pe_q: int, de_q: int, pe_class: str,
                inputs: Callable[[], dict[str, Any]]) -> None:
        self.log.record(
            at=time.time(), rid=f.rid, attempt=f.att, agent=f.req.agent, turn=f.req.turn,
            length=len(f.req.tokens), gen=f.req.gen, cached=f.cached, pe=f.pe, de=f.de,
            de_group=f.de_group, side=side, pe_tokens=f.pe_tokens,
            de_tokens=f.cached - f.pe_tokens, pe_read_q=pe_q, de_read_q=de_q,
            pe_class=pe_class, de_class=f.place.get("de_class"), z=f.place.get("z"),
            inputs=inputs)
