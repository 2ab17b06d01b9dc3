"""The global scheduler service: FIFO, pull-based group fetches, decisions from core/ only.

Runs in the launcher on its own thread and endpoint. Engines say ``hello`` and send
heartbeats; group leaders send ``fetch`` periodically. On a PE group fetch the service walks
the global FIFO and calls :func:`dualpath_cli.core.policies.decide` for each request with
the engines' current ``seq``/``tok``/``read_q``/``hbm_free`` (kept here from assignments,
read completions and reports), dispatches ``decode`` to the DE and ``prefill`` to the PE and
logs the decision with its inputs as one JSON line. An engine that stops heartbeating (or
whose process exits) is marked dead; its in-flight requests are cancelled on their other
engine and re-queued at the head of the FIFO with a new attempt number, so none is lost.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from dualpath_cli.core.de_schedule import GroupLoads
from dualpath_cli.core.layout import Namespace, longest_cached_prefix, prefix_keys
from dualpath_cli.core.policies import SchedParams, decide, get_policy
from dualpath_cli.core.types import EngineSnapshot, Request, Role
from dualpath_cli.errors import NoAvailableEngine, UsageError
from dualpath_cli.runtime.ports import StorePort
from dualpath_cli.transfer.base import Fabric, Message

__all__ = ["RUNTIME_POLICIES", "TurnRequest", "TurnResult", "Ticket", "EngineState",
           "SchedulerService"]

#: runtime policy -> (core read-path policy, layerwise prefill, NIC shaping)
RUNTIME_POLICIES: dict[str, tuple[str, bool, bool]] = {
    "dualpath": ("dualpath", True, True),
    "basic": ("basic", False, True),
    "round-robin": ("round-robin", True, True),
    "random": ("random", True, True),
    "split": ("split", True, True),
    "oracle": ("basic", True, False),
}


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


class Ticket:
    """A handle to wait on a turn's result."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.result: TurnResult | None = None
        self.first_event = threading.Event()

    def wait(self, timeout: float | None = None) -> TurnResult:
        """Block until the turn is done."""
        if not self.event.wait(timeout):
            raise TimeoutError("turn did not finish in time")
        assert self.result is not None
        return self.result


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
    report: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Flight:
    rid: int
    req: TurnRequest
    ticket: Ticket
    submitted: float
    att: int = 0
    cached: int = 0
    keys: list[str] = field(default_factory=list)
    max_hit_blocks: int | None = None
    pe: int = -1
    de: int = -1
    pe_tokens: int = 0
    charged: dict[int, int] = field(default_factory=dict)  # node -> read tokens pending
    prefilled: bool = False
    first_at: float = 0.0


class SchedulerService:
    """The launcher-side scheduler. See the module docstring.

    Args:
        fabric: the transfer fabric the engines use.
        store: used for prefix lookups (``contains``) only.
        namespace: prefix-key namespace (model, layout, block shape).
        policy: runtime policy name (see :data:`RUNTIME_POLICIES`).
        params: resolved scheduler thresholds (tokens).
        hbm_tokens: KV capacity of each DE in tokens.
        heartbeat_timeout: seconds without a heartbeat before an engine is declared dead.
        decision_log: JSONL path for decisions (None: keep them in memory only).
    """

    def __init__(self, fabric: Fabric, store: StorePort, namespace: Namespace, policy: str,
                 params: SchedParams, hbm_tokens: int, *, heartbeat_timeout: float = 1.0,
                 decision_log: Path | None = None) -> None:
        if policy not in RUNTIME_POLICIES:
            raise UsageError(f"unknown runtime policy {policy!r}; choose one of: "
                             f"{', '.join(RUNTIME_POLICIES)}")
        core_name, self.layerwise, self.shaped = RUNTIME_POLICIES[policy]
        self.policy_name = policy
        self.policy = get_policy(core_name)
        self.params = params
        self.store = store
        self.ns = namespace
        self.bt = namespace.shape.block_tokens
        self.hbm_tokens = hbm_tokens
        self.hb_timeout = heartbeat_timeout
        self.ep = fabric.endpoint("scheduler")
        self.address = self.ep.address
        self.engines: dict[int, EngineState] = {}
        self.queue: collections.deque[_Flight] = collections.deque()
        self.flights: dict[int, _Flight] = {}
        self.read_q: dict[int, int] = collections.defaultdict(int)
        self.decisions: list[dict[str, Any]] = []
        self.dead_events: list[tuple[int, float]] = []
        self._log: IO[str] | None = open(decision_log, "a") if decision_log else None
        self._lock = threading.RLock()
        self._next_rid = 0
        self._ordinal = 0
        self._stop = threading.Event()
        self._registered = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._loop, daemon=True, name="scheduler")

    # -- public API ---------------------------------------------------------------------
    def register(self, engine_id: int, role: str, node: int, group: int) -> None:
        """Declare an engine before it starts (its address comes with ``hello``)."""
        with self._lock:
            self.engines[engine_id] = EngineState(engine_id, role, node, group,
                                                  last_seen=time.monotonic())

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

    def mark_dead(self, engine_id: int) -> None:
        """Declare an engine dead now (process exit seen by the cluster)."""
        with self._lock:
            self._dead(engine_id)

    def stop(self) -> None:
        """Tell engines to stop and end the service thread."""
        with self._lock:
            for e in self.engines.values():
                if e.address and e.alive:
                    self.ep.send(e.address, {"t": "stop"})
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.ep.close()
        if self._log:
            self._log.close()
            self._log = None

    def fresh_reports(self, after: float, timeout: float = 5.0) -> dict[int, dict[str, Any]]:
        """Reports of live engines all received after ``after`` (monotonic), waiting for them."""
        deadline = time.monotonic() + timeout
        with self._registered:
            while True:
                live = [e for e in self.engines.values() if e.alive]
                if all(e.report.get("received", 0.0) > after for e in live):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._registered.wait(left)
            return {eid: dict(e.report) for eid, e in self.engines.items()}

    def reports(self) -> dict[int, dict[str, Any]]:
        """Latest heartbeat report of each engine."""
        with self._lock:
            return {eid: dict(e.report) for eid, e in self.engines.items()}

    # -- prefix lookup ------------------------------------------------------------------
    def _lookup(self, f: _Flight) -> None:
        keys = prefix_keys(f.req.tokens.tolist(), self.ns)
        limit = (len(f.req.tokens) - 1) // self.bt  # always leave one token to prefill
        if f.max_hit_blocks is not None:
            limit = min(limit, f.max_hit_blocks)
        hits = longest_cached_prefix(keys[:limit], self.store.contains)
        f.keys = [k.hex for k in keys[:hits]]
        f.cached = hits * self.bt

    # -- service loop -------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            msg = self.ep.recv(timeout=0.05)
            with self._lock:
                if msg is not None:
                    self._handle(msg)
                self._check_heartbeats()

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        for e in list(self.engines.values()):
            if e.alive and e.address and now - e.last_seen > self.hb_timeout:
                self._dead(e.engine_id)

    def _handle(self, msg: Message) -> None:
        h = msg.header
        eid = int(h.get("eid", -1))
        e = self.engines.get(eid)
        if e is None or not e.alive:
            return
        e.last_seen = time.monotonic()
        kind = msg.kind
        if kind == "hello":
            e.address, e.pid = str(h["addr"]), int(h["pid"])
            self._registered.notify_all()
        elif kind == "hb":
            e.report = dict(h, received=time.monotonic())
            self._registered.notify_all()
        elif kind == "fetch":
            if e.role == Role.PREFILL.value:
                self._fetch(e.group)
        else:
            f = self.flights.get(int(h.get("rid", -1)))
            if f is None or f.att != int(h.get("att", -2)):
                return  # a stale attempt
            if kind == "read_done":
                node = e.node
                f.charged[node] = max(0, f.charged.get(node, 0) - int(h["tokens"]))
                self.read_q[node] = max(0, self.read_q[node] - int(h["tokens"]))
            elif kind == "first":
                f.prefilled = True
                f.first_at = float(h["at"])
                f.ticket.first_event.set()
            elif kind == "done":
                self._finish(f, h)
            elif kind == "read_failed":
                block = int(h["block"])
                self._requeue(f, max_hit=block if block >= 0 else None)

    def _finish(self, f: _Flight, h: dict[str, Any]) -> None:
        del self.flights[f.rid]
        f.ticket.result = TurnResult([int(t) for t in h["tokens"]], f.submitted,
                                     f.first_at, float(h["at"]), f.cached, f.att + 1, f.pe,
                                     f.de, f.pe_tokens, int(h["rx_from_pe"]),
                                     float(h.get("second_at", 0.0)))
        f.ticket.first_event.set()
        f.ticket.event.set()

    def _requeue(self, f: _Flight, max_hit: int | None = None) -> None:
        for eid in (f.pe, f.de):
            e = self.engines.get(eid)
            if e is not None and e.alive and e.address:
                self.ep.send(e.address, {"t": "cancel", "rid": f.rid})
        for node, tokens in f.charged.items():
            self.read_q[node] = max(0, self.read_q[node] - tokens)
        f.charged.clear()
        f.att += 1
        f.pe = f.de = -1
        f.prefilled = False
        if max_hit is not None:
            f.max_hit_blocks = max_hit
        self._lookup(f)
        self.queue.appendleft(f)

    def _dead(self, engine_id: int) -> None:
        e = self.engines.get(engine_id)
        if e is None or not e.alive:
            return
        e.alive = False
        self.dead_events.append((engine_id, time.monotonic()))
        for f in [f for f in self.flights.values() if engine_id in (f.pe, f.de)]:
            self._requeue(f)

    # -- scheduling ---------------------------------------------------------------------
    def _snapshots(self) -> tuple[dict[int, list[EngineSnapshot]], dict[int, list[
            EngineSnapshot]]]:
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
        pe: dict[int, list[EngineSnapshot]] = collections.defaultdict(list)
        de: dict[int, list[EngineSnapshot]] = collections.defaultdict(list)
        for e in self.engines.values():
            if not e.alive or not e.address:
                continue
            role = Role(e.role)
            snap = EngineSnapshot(e.engine_id, e.node, e.group, role, seq[e.engine_id],
                                  tok[e.engine_id], self.read_q[e.node],
                                  self.hbm_tokens - hbm_used[e.engine_id])
            (pe if role is Role.PREFILL else de)[e.group].append(snap)
        return pe, de

    def _fetch(self, group: int) -> None:
        if not self.queue:
            return
        pe_groups, de_groups = self._snapshots()
        pe_engines = pe_groups.get(group, [])
        if not pe_engines or not de_groups:
            return
        loads = GroupLoads({g: sum(s.tok for s in engines) for g, engines in de_groups.items()})
        while self.queue:
            f = self.queue[0]
            request = Request(f.rid, len(f.req.tokens), f.cached)
            try:
                res = decide(self.policy, request, pe_engines, de_groups, loads, self.params,
                             self._ordinal)
            except NoAvailableEngine:
                return
            self.queue.popleft()
            self._ordinal += 1
            d = res.decision
            pe_engines = list(res.pe_engines)
            de_groups[d.de_group] = list(res.de_engines)
            loads = res.loads
            self._dispatch(f, d.pe_engine, d.de_engine, d.plan.pe_tokens)
            self._record(f, d, pe_engines, de_groups[d.de_group])

    def _dispatch(self, f: _Flight, pe: int, de: int, pe_tokens: int) -> None:
        if not self.shaped:  # oracle: no storage NIC is involved, read locally for free
            pe_tokens = f.cached
        f.pe, f.de, f.pe_tokens = pe, de, pe_tokens
        pe_state, de_state = self.engines[pe], self.engines[de]
        de_tokens = f.cached - pe_tokens
        for node, tokens in ((pe_state.node, pe_tokens), (de_state.node, de_tokens)):
            if tokens:
                f.charged[node] = f.charged.get(node, 0) + tokens
                self.read_q[node] += tokens
        tokens = f.req.tokens.tolist()
        self.ep.send(de_state.address, {
            "t": "decode", "rid": f.rid, "att": f.att, "tokens": tokens, "gen": f.req.gen,
            "cached": f.cached, "keys": f.keys, "pe_tokens": pe_tokens,
            "pe": pe_state.address, "shaped": self.shaped})
        self.ep.send(pe_state.address, {
            "t": "prefill", "rid": f.rid, "att": f.att, "tokens": tokens, "cached": f.cached,
            "keys": f.keys[:pe_tokens // self.bt], "pe_tokens": pe_tokens,
            "de": de_state.address, "layerwise": self.layerwise, "shaped": self.shaped})

    def _record(self, f: _Flight, d: Any, pes: list[EngineSnapshot],
                des: list[EngineSnapshot]) -> None:
        side = d.plan.side.value if d.plan.side is not None else "split"
        entry = {
            "at": time.time(), "policy": self.policy_name, "rid": f.rid, "attempt": f.att,
            "agent": f.req.agent, "turn": f.req.turn, "length": len(f.req.tokens),
            "cached": f.cached, "pe": d.pe_engine, "de_group": d.de_group, "de": d.de_engine,
            "side": side, "pe_tokens": f.pe_tokens, "de_tokens": f.cached - f.pe_tokens,
            "pe_read_q": d.pe_read_q, "de_read_q": d.de_read_q, "z": d.z,
            "alpha": self.params.alpha, "beta": self.params.beta,
            "engines": [{"id": s.engine_id, "role": s.role.value, "node": s.node,
                         "seq": s.seq, "tok": s.tok, "read_q": s.read_q,
                         "hbm_free": s.hbm_free} for s in (*pes, *des)],
        }
        self.decisions.append(entry)
        if self._log:
            self._log.write(json.dumps(entry) + "\n")
            self._log.flush()
