"""The scheduler's state and the bookkeeping every part of it shares.

:class:`SchedulerCore` names every field the scheduler keeps (set by
:class:`~dualpath_cli.runtime.scheduler.SchedulerService`'s constructor) and holds what the
message loop, the dispatching decisions, the controls and the reads all use: sending to an
engine, the prefix lookup of a turn, counting engines by state, and each engine's load kept
as turns move (:meth:`SchedulerCore._load_delta`).

Why one base and several parts (:mod:`~dualpath_cli.runtime.sched_control`,
:mod:`~dualpath_cli.runtime.sched_dispatch`, :mod:`~dualpath_cli.runtime.sched_loop`,
:mod:`~dualpath_cli.runtime.sched_reads`) instead of one class: each concept reads on its
own, while a message still costs what it did (the parts are one class's methods: no call
goes through another object).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dualpath_cli.core.controllers import Controllers
from dualpath_cli.core.de_schedule import GroupLoads
from dualpath_cli.core.layout import KEY_BYTES, Namespace, PrefixKeyCache, PresentPrefixCache
from dualpath_cli.core.policies import Policy, SchedParams
from dualpath_cli.core.types import Request, Role
from dualpath_cli.runtime.decisions import DecisionLog
from dualpath_cli.runtime.engine_table import ENGINE_STATES, EngineState, EngineTable
from dualpath_cli.runtime.ledger import RequestLedger
from dualpath_cli.runtime.turns import Flight
from dualpath_cli.runtime.wire import KeyArray, TokenArray, WireMessage, encode
from dualpath_cli.storage import KVStore
from dualpath_cli.storage.store import removal_generation
from dualpath_cli.telemetry.registry import Counter, Histogram, MetricsRegistry
from dualpath_cli.transfer.base import Endpoint, Message

__all__ = ["SchedulerCore"]


class SchedulerCore:
    """The scheduler's fields and shared bookkeeping (module doc); not built on its own."""

    # -- configuration (the constructor's arguments, resolved) -------------------------
    layerwise: bool
    shaped: bool
    policy_name: str
    read_side: str
    policy: Policy
    params: SchedParams
    quota_s: float
    sources: dict[str, str]
    _sources_copy: dict[str, str]
    store: KVStore
    ns: Namespace
    bt: int
    hbm_tokens: int
    hb_timeout: float
    control_interval_s: float
    batch_window_s: float
    snic_bw: float
    snic_scale: dict[int, float]
    # -- the endpoint and the loop ----------------------------------------------------
    ep: Endpoint
    address: str
    _lock: threading.RLock
    _registered: threading.Condition
    _stop: threading.Event
    _thread: threading.Thread
    _handlers: dict[type, Callable[[EngineState, Any, float], None]]
    on_message: Callable[[Message], None]
    on_sweep: Callable[[], None]
    # -- engines and turns ------------------------------------------------------------
    engines: EngineTable
    queue: collections.deque[Flight]
    private: dict[int, collections.deque[Flight]]
    pe_queue: collections.deque[Flight]
    flights: dict[int, Flight]
    _fetchers: dict[tuple[str, int], int]
    _report_to: dict[tuple[str, int], int]
    _next_rid: int
    _ordinal: int
    # -- what it records --------------------------------------------------------------
    registry: MetricsRegistry
    log: DecisionLog
    ledger: RequestLedger
    dead_events: list[tuple[int, float]]
    requeued: int
    revived: int
    bad_messages: int
    _m_ttft: Histogram
    _m_tpot: Histogram
    _pe_fetch_s: list[float]
    _de_fetch_s: list[float]
    _m_decide: dict[str, Histogram]
    _m_cpu: Counter
    _cpu_at: float
    # -- the controllers --------------------------------------------------------------
    controllers: Controllers
    _ctl_values: dict[str, float]
    _ctl_next: float
    _ttfts: list[float]
    # -- hot-path state (see _lookup, _load_delta, Dispatching._members) -----------------
    _prefix: PrefixKeyCache
    _present: PresentPrefixCache
    _seq: dict[int, int]
    _tok: dict[int, int]
    _hbm_used: dict[int, int]
    _de_group_tok: dict[int, int]
    _routed_tok: dict[int, int]
    _group_loads: GroupLoads | None
    _group_loads_for: object
    _index_n: int
    _by_group: dict[str, dict[int, list[EngineState]]]
    _by_node: dict[int, list[EngineState]]
    _live_version: int
    _live_key: tuple[int, int]
    _live: dict[str, dict[int, list[EngineState]]]
    # -- membership (telemetry/membership.py): role -> (since, why); role -> "D0 left" ------
    role_gaps: dict[str, tuple[float, str]]
    last_gone: dict[str, str]
    _draining: set[int]

    def _send(self, to: str, msg: WireMessage) -> bool:
        """Send ``msg`` to ``to``; False when the endpoint dropped it (closed, or the peer
        did not take it within the send timeout)."""
        header, frames = encode(msg)
        return self.ep.send(to, header, frames) is not False

    def _count_engines(self) -> None:
        """Engines by role and state (the gauges), and the roles' gaps: a role with no
        ready engine is open since the first count that found none (see
        ``telemetry.membership``), with the last departure of that role as its why."""
        for role in (Role.PREFILL.value, Role.DECODE.value):
            counts = dict.fromkeys(ENGINE_STATES, 0)
            for e in self.engines.values():
                if e.role == role:
                    counts[e.state] += 1
            for state, n in counts.items():
                self.registry.gauge("dualpath_scheduler_engines", role=role, state=state).set(n)
                self.registry.gauge("dualpath_engines", role=role, state=state).set(n)
            if counts["ready"] or counts["draining"]:  # draining: until it has left
                self.role_gaps.pop(role, None)
            elif role not in self.role_gaps:
                self.role_gaps[role] = (time.time(), self.last_gone.get(role, ""))

    # -- prefix lookup ------------------------------------------------------------------
    def _lookup(self, f: Flight) -> None:
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
        self.ledger.lookup(f.rid, f.req.agent, got.raw, len(f.req.tokens), hits,
                           turn=f.req.turn)

    # -- loads -------------------------------------------------------------------------
    def _request(self, f: Flight) -> Request:
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

    def _load_delta(self, f: Flight, sign: int, de: bool = True) -> None:
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
