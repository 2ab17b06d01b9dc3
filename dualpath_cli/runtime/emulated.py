"""Emulated engines: the real protocol over real sockets, with time taken from a cost model.

Why: the control plane (the scheduler's thread, its sockets, its decisions) has to be proven
at the paper's scale, 48P96D = 1,152 engines, on a machine that cannot run 1,152 models
(Dynamo's "mocker" idea). An emulated engine says ``hello``, heartbeats, reports its read
queue (``rq``/``seen``) to its group leader, which ``fetch``-es carrying the group's reports,
and it answers ``prefill``/``decode``
with ``first``/``done`` exactly as a real one does, over its own ZeroMQ PULL socket; PE and
DE talk to each other with real :class:`~dualpath_cli.runtime.wire.Layer` and
:class:`~dualpath_cli.runtime.wire.PrefillDone` messages. What it does *not* do is move KV
bytes or run a model: read, transfer, prefill and decode times come from a cost model
(:class:`CostPort`: the simulator's :class:`~dualpath_cli.core.costs.CostModel` fits it), and
the generated tokens are a deterministic function of the prompt.

One :class:`EmulatedHost` runs many engines on one thread (a heap of timers plus one
``zmq.Poller`` over the engines' sockets), so a few processes hold 1,152 engines. A node's
engines live in one host, which keeps the node's storage NIC a single local timeline.

Simplifications, said once here: a PE computes its prefills one after another (no quota
batching); a DE prices a request's whole decode when it starts, with the batch it joins
(``gen x decode_step_s(batch)``); a DE "persists" the new full blocks of a finished turn as
empty marker files at the store's block paths (so the next turn's prefix lookup hits, as in
the real runtime) under a namespace of its own, which real engines never look up; HBM and
faults are not emulated (a ``fault`` is acknowledged and ignored, a ``compact`` counted).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import logging
import os
import queue
import selectors
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import zmq

from dualpath_cli.core.layout import BlockKey, Namespace, chain_keys
from dualpath_cli.faultspec import Fault
from dualpath_cli.runtime.attempts import EndedAttempts
from dualpath_cli.runtime.hbm import Compact
from dualpath_cli.runtime.kept_reports import KeptReports
from dualpath_cli.runtime.wire import (
    Cancel,
    Decode,
    Done,
    Fetch,
    First,
    GroupLeader,
    Heartbeat,
    Hello,
    Layer,
    Lead,
    MetricsRequest,
    Prefill,
    PrefillDone,
    QueueReport,
    SetQuota,
    Stop,
    TokenArray,
    WireError,
    WireMessage,
    decode,
    encode,
    full_prompt,
)
from dualpath_cli.storage import PosixStore
from dualpath_cli.transfer.zmq_fabric import ZmqEndpoint

__all__ = ["CostPort", "EmulatedSpec", "EmulatedHost", "emulated_tokens", "MAX_SOCKETS"]

log = logging.getLogger(__name__)

#: ZeroMQ sockets one process may hold (libzmq's default, 1023, is below 1,152 engines).
MAX_SOCKETS = 16384


class CostPort(Protocol):
    """The timing an emulated engine needs (the simulator's ``CostModel`` provides it)."""

    kv_bytes_per_token: int
    snic_rate: float
    cnic_kv_rate: float

    def prefill_s(self, cached: int, bsz: int) -> float:
        """Compute seconds of ``bsz`` new tokens after ``cached`` ones."""
        ...

    def batch_s(self, compute_s: float, load_bytes: float, layerwise: bool) -> float:
        """A prefill forward: compute plus loading ``load_bytes`` of KV into HBM."""
        ...

    def decode_step_s(self, batch: int, attended_tokens: int) -> float:
        """One decode step of ``batch`` requests attending to ``attended_tokens``."""
        ...

    def attended(self, context: int) -> int:
        """Tokens one decode step of a request with ``context`` tokens attends to."""
        ...


@dataclass(frozen=True)
class EmulatedSpec:
    """One emulated engine (picklable; no NIC buckets: the cost model prices the NICs)."""

    engine_id: int
    role: str
    node: int
    group: int
    leader: bool
    ctl: str
    heartbeat_s: float = 0.5
    fetch_s: float = 0.1
    quota_s: float = 0.3
    hbm_blocks: int = 4096
    block_tokens: int = 64
    metrics_s: float = 5.0


def emulated_tokens(prompt: Sequence[int], gen: int, vocab: int = 256, *,
                    length: int | None = None) -> tuple[int, ...]:
    """The tokens an emulated DE "generates": a fixed function of the prompt's length and
    last token (and ``gen``); ``prompt`` may be its tail, then ``length`` is the whole's.

    Deterministic, so two runs of one workload give identical tokens and the next turn's
    prompt (context + these) repeats the same prefix keys; the last token is always in a
    dispatch's tokens (one is always left to prefill), so the answer does not depend on
    how much of the prompt was a hit.
    """
    n = len(prompt) if length is None else length
    seed = (n * 2654435761 + (int(prompt[-1]) if len(prompt) else 0)) % vocab
    return tuple((seed + 7 * i) % vocab for i in range(gen))


@dataclass
class _Read:
    """One read on a node's storage NIC: charged to ``rq`` until it ends."""

    tokens: int
    seq: int


@dataclass
class _Job:
    rid: int
    att: int
    prompt: TokenArray  # off the wire: the prompt from token ``start`` on
    cached: int
    pe_tokens: int
    peer: str  # the DE (on a PE) or the PE (on a DE)
    layerwise: bool = True
    gen: int = 0
    keys: Sequence[str] = ()
    read_done: bool = False
    peer_kv: bool = True  # PE: the DE's part of the hit arrived (or there is none)
    first: int = -1  # DE: the first token (from PrefillDone)
    received: float = 0.0
    start: int = 0

    @property
    def length(self) -> int:
        """The whole prompt's tokens."""
        return self.start + len(self.prompt)


@dataclass
class _Engine:
    spec: EmulatedSpec
    ep: ZmqEndpoint
    started: float
    jobs: dict[int, _Job] = field(default_factory=dict)
    reads: dict[int, _Read] = field(default_factory=dict)  # rid -> read in flight
    n: int = 0  # report order
    seen: int = -1  # last dispatch sequence counted in rq
    rq: int = 0
    gpu_free: float = 0.0
    busy_s: float = 0.0
    active: int = 0  # DE: requests decoding
    compactions: int = 0
    early: dict[int, tuple[int, int]] = field(default_factory=dict)  # rid -> (att, token)
    early_kv: dict[int, int] = field(default_factory=dict)  # rid -> att of a DE's KV
    quota_s: float = 0.3
    stopped: bool = False
    leads: bool = False  # promoted to its group's fetcher (Lead) after the leader died
    report_to: str = ""  # the group leader's address (GroupLeader); "": the scheduler
    group_reports: KeptReports = field(default_factory=KeptReports)  # a leader's
    ended: EndedAttempts = field(default_factory=EndedAttempts)  # cancelled attempts

    @property
    def eid(self) -> int:
        return self.spec.engine_id

    @property
    def leading(self) -> bool:
        """It fetches for its group (its leader from the start, or promoted)."""
        return self.spec.leader or self.leads


class EmulatedHost:
    """Many emulated engines on one thread of one process. See the module docstring.

    Args:
        specs: the engines to run (whole nodes: a node's engines share its storage NIC).
        costs: the timing model.
        namespace: the namespace of the marker blocks (must differ from real engines').
        store_root: the shared store directory (``None``: persist nothing, so no turn hits).
        speed: emulated seconds per real second (2: everything takes half as long).
        clock: the monotonic clock (tests may pass their own).
    """

    def __init__(self, specs: list[EmulatedSpec], costs: CostPort, namespace: Namespace,
                 store_root: Path | None = None, speed: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not speed > 0:
            raise ValueError(f"speed {speed!r}: must be > 0")
        self.costs = costs
        self.ns = namespace
        self.speed = speed
        self.clock = clock
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, MAX_SOCKETS)
        # one sender for every engine of this process; never blocks the loop (a slow
        # scheduler queues here, a dead peer's messages are dropped at once)
        self.out = ZmqEndpoint(self.ctx, send_timeout_ms=0, send_hwm=0)
        self.engines: dict[int, _Engine] = {}
        self._by_addr: dict[str, _Engine] = {}  # this process's engines by address
        # epoll on the sockets' ZMQ_FD: a wake-up costs O(ready), where zmq.Poller over
        # hundreds of sockets costs about a millisecond per call
        self.selector = selectors.DefaultSelector()
        now = clock()
        for spec in specs:
            ep = ZmqEndpoint(self.ctx)
            e = _Engine(spec, ep, now, quota_s=spec.quota_s)
            self.engines[spec.engine_id] = e
            self._by_addr[ep.address] = e
            self.selector.register(int(ep.socket.getsockopt(zmq.FD)), selectors.EVENT_READ, e)
        self.snic_free: dict[int, float] = {}  # node -> when its storage NIC is free
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._tick = itertools.count()
        self.store = PosixStore(store_root) if store_root is not None else None
        self.persisted = 0
        # marker files are written off the loop (file creation is slow next to a message)
        self._writes: queue.SimpleQueue[tuple[str | None, np.ndarray, int, str,
                                              Done] | None] = queue.SimpleQueue()
        # a few threads: creating a file waits on the file system, not on the GIL
        self._writers = [threading.Thread(target=self._write_loop, daemon=True,
                                          name=f"emulated-persist-{i}") for i in range(4)]
        if self.store is not None:
            for t in self._writers:
                t.start()

    # -- timers ---------------------------------------------------------------------------
    def at(self, when: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` at monotonic time ``when`` (on the host's thread)."""
        heapq.heappush(self._timers, (when, next(self._tick), fn))

    def _scaled(self, seconds: float) -> float:
        return seconds / self.speed

    # -- the loop -------------------------------------------------------------------------
    def run(self, stop: Callable[[], bool] | None = None) -> None:
        """Serve until every engine got ``stop`` (or ``stop()`` is true)."""
        now = self.clock()
        for i, e in enumerate(self.engines.values()):
            self._send(e, e.spec.ctl, Hello(e.eid, e.ep.address, e.spec.role, e.spec.node,
                                            e.spec.group, os.getpid()))
            # spread the periodic messages over their period (no thundering herd)
            phase = (i % 97) / 97.0
            self.at(now + phase * e.spec.heartbeat_s, functools.partial(self._heartbeat, e))
            if e.spec.leader:
                self.at(now + phase * e.spec.fetch_s, functools.partial(self._fetch, e))
        live = len(self.engines)
        sweep = now
        try:
            while live:
                if stop is not None and stop():
                    break
                now = self.clock()
                while self._timers and self._timers[0][0] <= now:
                    _, _, fn = heapq.heappop(self._timers)
                    fn()
                wait = self._timers[0][0] - self.clock() if self._timers else 0.1
                for key, _ in self.selector.select(min(max(wait, 0.0), 0.1)):
                    self._drain(key.data)
                if now >= sweep:  # ZMQ_FD is edge-like: a rare missed wake-up ends here
                    for e in self.engines.values():
                        self._drain(e)
                    sweep = now + 0.25
                live = sum(1 for e in self.engines.values() if not e.stopped)
        finally:
            self.close()

    def _drain(self, e: _Engine) -> None:
        """Handle every message waiting on ``e``'s socket."""
        while not e.stopped:
            raw = e.ep.recv(timeout=0)
            if raw is None:
                return
            try:
                msg = decode(raw.header, raw.buffers)
            except WireError as err:
                log.warning("emulated engine %d: dropped a message: %s", e.eid, err)
                continue
            self.handle(e, msg)

    def close(self) -> None:
        """Close every socket and the context; finish the marker writes."""
        live = [t for t in self._writers if t.is_alive()]
        for _ in live:
            self._writes.put(None)
        for t in live:
            t.join()
        self.selector.close()
        for e in self.engines.values():
            e.ep.close()
        self.out.close()
        self.ctx.term()

    def _send(self, e: _Engine | None, to: str, msg: WireMessage) -> None:
        del e
        header, frames = encode(msg)
        self.out.send(to, header, frames)

    # -- periodic ---------------------------------------------------------------------------
    def _heartbeat(self, e: _Engine, metrics: bool = False) -> None:
        if e.stopped:
            return
        now = self.clock()
        e.n += 1
        self._send(e, e.spec.ctl, Heartbeat(
            e.eid, e.n, e.seen, e.rq, uptime_s=now - e.started, busy_s=e.busy_s,
            jobs=len(e.jobs), quota_s=e.quota_s, compactions=e.compactions,
            hbm_capacity_blocks=e.spec.hbm_blocks, metrics={} if metrics else None))
        if not metrics:
            self.at(now + e.spec.heartbeat_s, lambda: self._heartbeat(e))

    def _fetch(self, e: _Engine) -> None:
        if e.stopped:
            return
        reports = e.group_reports.take()  # the group's, since the last fetch
        self._send(e, e.spec.ctl, Fetch(e.eid, e.spec.group, e.spec.role, reports))
        self.at(self.clock() + e.spec.fetch_s, lambda: self._fetch(e))

    def _report(self, e: _Engine) -> None:
        """A queue report: kept for the next fetch by a leader, sent to the group's leader
        by a member (handed over when the leader is an engine of this process, as the
        message would be), to the scheduler while the group has no leader named."""
        e.n += 1
        report = (e.eid, e.n, e.seen, e.rq)
        if e.leading:
            e.group_reports.keep(*report)
        elif e.report_to:
            leader = self._by_addr.get(e.report_to)
            if leader is not None:
                self._keep(leader, report)
            else:
                self._send(e, e.report_to, QueueReport(*report))
        else:
            self._send(e, e.spec.ctl, QueueReport(*report))

    def _keep(self, leader: _Engine, report: tuple[int, int, int, int]) -> None:
        """``leader`` keeps a member's newest report; an engine that does not lead (or has
        stopped) passes it to the scheduler."""
        if not leader.leading or leader.stopped:
            self._send(leader, leader.spec.ctl, QueueReport(*report))
            return
        leader.group_reports.keep(*report)

    # -- messages ---------------------------------------------------------------------------
    def handle(self, e: _Engine, msg: WireMessage) -> None:
        """One message to engine ``e``."""
        if isinstance(msg, Stop):
            e.stopped = True
            e.jobs.clear()
        elif isinstance(msg, Prefill):
            self._on_prefill(e, msg)
        elif isinstance(msg, Decode):
            self._on_decode(e, msg)
        elif isinstance(msg, Layer):
            job = e.jobs.get(msg.rid)
            if job is not None and job.att == msg.att:
                job.peer_kv = True
                self._maybe_compute(e, job)
            elif job is None or job.att < msg.att:  # overtook its ``prefill``
                e.early_kv[msg.rid] = msg.att
        elif isinstance(msg, PrefillDone):
            job = e.jobs.get(msg.rid)
            if job is not None and job.att == msg.att:
                job.first = msg.token
                self._maybe_decode(e, job)
            elif job is None or job.att < msg.att:  # overtook its ``decode`` (two sockets)
                e.early[msg.rid] = (msg.att, msg.token)
        elif isinstance(msg, Cancel):
            held = e.jobs.get(msg.rid)
            if e.ended.cancel(msg.rid, msg.att, held.att if held is not None else -1) or (
                    held is None):  # (a newer attempt's job held: kept)
                self._drop(e, msg.rid)
        elif isinstance(msg, SetQuota):
            e.quota_s = msg.quota_s
        elif isinstance(msg, QueueReport):  # a member's, for this leader's next fetch
            self._keep(e, (msg.eid, msg.n, msg.seen, msg.rq))
        elif isinstance(msg, GroupLeader):
            e.report_to = msg.addr if msg.addr != e.ep.address else ""
        elif isinstance(msg, Lead):  # the group's leader died: fetch for it from now on
            if not (e.spec.leader or e.leads):
                e.leads = True
                self._fetch(e)
        elif isinstance(msg, MetricsRequest):
            self._heartbeat(e, metrics=True)
        elif isinstance(msg, Compact):
            e.compactions += 1
            self._heartbeat(e, metrics=True)
        elif isinstance(msg, Fault):
            self._heartbeat(e, metrics=True)

    def _read(self, e: _Engine, job: _Job, tokens: int, seq: int,
              then: Callable[[], None]) -> None:
        """Read ``tokens`` of KV on the node's storage NIC (FIFO), then call ``then``."""
        now = self.clock()
        e.seen = max(e.seen, seq)
        if tokens <= 0:
            then()
            return
        e.reads[job.rid] = _Read(tokens, seq)
        e.rq += tokens  # reported when the read ends: the scheduler charged it till then
        rate = self.costs.snic_rate
        seconds = self._scaled(tokens * self.costs.kv_bytes_per_token / rate) if rate > 0 else 0
        start = max(now, self.snic_free.get(e.spec.node, 0.0))
        end = start + seconds
        self.snic_free[e.spec.node] = end
        rid, att = job.rid, job.att

        def done() -> None:
            read = e.reads.get(rid)
            if read is None or read.seq != seq:
                return  # cancelled
            del e.reads[rid]
            e.rq -= read.tokens
            self._report(e)
            j = e.jobs.get(rid)
            if j is not None and j.att == att:
                then()

        self.at(end, done)

    def _drop(self, e: _Engine, rid: int, early: bool = True) -> None:
        """Every trace of ``rid`` on ``e``: its job, its read's queue and (``early``) the
        messages that came before its job."""
        e.jobs.pop(rid, None)
        if early:
            e.early.pop(rid, None)
            e.early_kv.pop(rid, None)
        read = e.reads.pop(rid, None)
        if read is not None:
            e.rq -= read.tokens
            self._report(e)

    # PE ---------------------------------------------------------------------------------
    def _on_prefill(self, e: _Engine, m: Prefill) -> None:
        forward = m.decode(e.ep.address)
        if forward is not None:  # the DE's part, ahead of this turn's KV
            self._send(e, m.de, forward)
        job = _Job(m.rid, m.att, m.tokens, m.cached, m.pe_tokens, m.de, m.layerwise,
                   peer_kv=m.cached <= m.pe_tokens, received=self.clock(), start=m.start)
        e.jobs[m.rid] = job
        if e.early_kv.pop(m.rid, -1) == m.att:
            job.peer_kv = True

        def loaded() -> None:
            job.read_done = True
            self._maybe_compute(e, job)

        self._read(e, job, m.pe_tokens, m.seq, loaded)

    def _maybe_compute(self, e: _Engine, job: _Job) -> None:
        if not (job.read_done and job.peer_kv):
            return
        c = self.costs
        new = job.length - job.cached
        compute = c.batch_s(c.prefill_s(job.cached, new),
                            job.cached * c.kv_bytes_per_token, job.layerwise)
        seconds = self._scaled(compute)
        start = max(self.clock(), e.gpu_free)
        end = start + seconds
        e.gpu_free = end
        e.busy_s += seconds
        token = emulated_tokens(job.prompt, 1, length=job.length)[0]
        kv_s = self._scaled(new * c.kv_bytes_per_token / c.cnic_kv_rate) if c.cnic_kv_rate else 0

        def first() -> None:
            if e.jobs.get(job.rid) is not job:
                return
            self._send(e, e.spec.ctl, First(e.eid, job.rid, job.att, token, self.clock()))
            self.at(self.clock() + kv_s, sent)

        def sent() -> None:
            if e.jobs.get(job.rid) is not job:
                return  # cancelled (a new attempt may hold the id now)
            del e.jobs[job.rid]
            self._send(e, job.peer, PrefillDone(job.rid, job.att, token))

        self.at(end, first)

    # DE ---------------------------------------------------------------------------------
    def _on_decode(self, e: _Engine, m: Decode) -> None:
        held = e.jobs.get(m.rid)
        if e.ended.stale(m.rid, m.att, held.att if held is not None else -1):
            e.seen = max(e.seen, m.seq)
            return  # cancelled before it came (the PE forwarded it), or a newer one is here
        if held is not None and held.att < m.att:  # its Cancel is still on the way
            e.ended.end(m.rid, held.att)
            self._drop(e, m.rid, early=False)  # early messages may be this attempt's
        job = _Job(m.rid, m.att, m.tokens, m.cached, m.pe_tokens, m.pe, gen=m.gen,
                   keys=m.keys, received=self.clock(), start=m.start)
        e.jobs[m.rid] = job
        early = e.early.pop(m.rid, None)
        if early is not None and early[0] == m.att:
            job.first = early[1]
            self._maybe_decode(e, job)
        de_tokens = m.cached - m.pe_tokens
        c = self.costs

        def loaded() -> None:
            job.read_done = True
            if de_tokens > 0:  # stream the hit rows to the PE over the compute NIC
                kv_s = self._scaled(de_tokens * c.kv_bytes_per_token / c.cnic_kv_rate
                                    ) if c.cnic_kv_rate else 0.0

                def push() -> None:
                    if e.jobs.get(job.rid) is job:
                        self._send(e, job.peer, Layer(job.rid, job.att, -1))

                self.at(self.clock() + kv_s, push)

        self._read(e, job, de_tokens, m.seq, loaded)

    def _maybe_decode(self, e: _Engine, job: _Job) -> None:
        c = self.costs
        e.active += 1
        context = job.length + job.gen // 2
        step = self._scaled(c.decode_step_s(e.active, e.active * c.attended(context)))
        now = self.clock()
        second_at = now + step
        end = now + step * max(0, job.gen - 1)
        e.busy_s += end - now

        def finish() -> None:
            e.active -= 1
            if e.jobs.get(job.rid) is not job:
                return
            del e.jobs[job.rid]
            tokens = (job.first, *emulated_tokens(job.prompt, job.gen,
                                                  length=job.length)[1:])[:job.gen]
            done = Done(e.eid, job.rid, job.att, tokens,
                        (job.length - job.pe_tokens) * c.kv_bytes_per_token,
                        self.clock(), second_at if job.gen > 1 else 0.0)
            self._persist(e, job, tokens, done)

        self.at(end, finish)

    def _persist(self, e: _Engine, job: _Job, out: tuple[int, ...], done: Done) -> None:
        """Write marker files for the full blocks past the hit, then send ``done``.

        As a real DE has persisted a turn's blocks before it answers, so the agent's next
        turn finds its prefix; the writing thread sends ``done`` (sends are thread-safe).
        """
        if self.store is None:
            self._send(e, e.spec.ctl, done)
        else:
            seq = np.concatenate([full_prompt(job.prompt, job.start),
                                  np.asarray(out, dtype=np.int64)])
            self._writes.put((job.keys[-1] if job.keys else None, seq,
                              len(job.keys), e.spec.ctl, done))

    def _write_loop(self) -> None:
        while True:
            item = self._writes.get()
            if item is None:
                return
            last, seq, first, to, done = item
            try:
                stored = self._write(last, seq, first)
            except OSError as err:  # a full or read-only store: the turns just miss
                log.warning("emulated engines: marker block not written: %s", err)
            else:
                done = dataclasses.replace(done, stored=stored)
            self._send(None, to, done)

    def _write(self, last: str | None, seq: np.ndarray, first: int) -> int:
        """Marker files for the full blocks of ``seq`` from block ``first`` on; returns the
        full blocks then in the store from the first (``Done.stored``)."""
        assert self.store is not None
        n = first
        parent = BlockKey.from_hex(last) if last is not None else None
        for key in chain_keys(seq, self.ns, parent, first):
            path = str(self.store.path(key))
            if self._create(path):
                self.persisted += 1
            n += 1
        return n

    @staticmethod
    def _create(path: str) -> bool:
        """An empty marker file at ``path``; False when one is there already."""
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
        os.close(fd)
        return True
