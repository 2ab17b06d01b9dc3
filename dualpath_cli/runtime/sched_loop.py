"""The scheduler's service loop and what each engine message does.

Engines say ``hello``, send heartbeats and read-queue reports (a group's ride on its
leader's fetches, paper 6.1); group leaders send ``fetch`` (pull); engines answer a turn with
``first`` and ``done`` (or ``read_failed``). The loop takes what is waiting in one batch
under the lock, then, between batches, sweeps for silent engines and steps the controllers.
An engine that stops heartbeating (or whose process exits) is marked dead and its turns are
re-queued; one that was only silent and reports again is revived.
"""

from __future__ import annotations

import collections
import logging
import time

from dualpath_cli.core.layout import KEY_BYTES, BlockKey
from dualpath_cli.core.types import Role
from dualpath_cli.runtime.engine_table import EngineState
from dualpath_cli.runtime.fabric_loss import kv_loss_engine
from dualpath_cli.runtime.sched_dispatch import Dispatching
from dualpath_cli.runtime.turns import Flight, TurnCancelled, TurnResult
from dualpath_cli.runtime.wire import (
    Cancel,
    Done,
    Fetch,
    First,
    GroupLeader,
    Heartbeat,
    Hello,
    Lead,
    QueueReport,
    ReadFailed,
    Tokens,
    WireError,
    decode,
)
from dualpath_cli.transfer.base import Message

__all__ = ["MessageLoop", "BATCH_MAX"]

log = logging.getLogger(__name__)

#: How a departure reads in a missing role's line (``no decode engine since ... (D0 left)``).
_GONE_WORDS = {"left": "left", "exited": "died", "silent": "fell silent"}

#: the most messages one batch handles before the loop looks at its timers again (a burst
#: bigger than this is handled in several passes, without the wait between them)
BATCH_MAX = 512


class MessageLoop(Dispatching):
    """The service loop and the message handlers (module doc)."""

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
                    if not window or n >= BATCH_MAX:
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
        """The loop's periodic pass: silent engines, leaving ones, and the cost sample."""
        self._check_heartbeats()
        if self._draining:
            self._settle_drains()
        self._sample_cost()

    def _start_drains(self) -> None:
        """Turns placed on a draining DE but not started go back to the FIFO, and so do
        those routed to a DE group with no engine left to take them."""
        for f in [f for f in self.pe_queue if f.de in self._draining]:
            self._requeue(f, "engine_left")
        live = self._live_members(Role.DECODE.value)
        for g in [g for g, q in self.private.items() if q and g not in live]:
            stranded = self.private.pop(g)
            self._routed_tok.pop(g, None)
            self._group_loads = None
            self.queue.extendleft(reversed(stranded))

    def _settle_drains(self) -> None:
        """Draining engines that hold no turn any more (or whose drain timed out) leave."""
        busy = {f.de for f in self.flights.values() if f.de >= 0}
        busy.update(f.pe for f in self.flights.values() if f.pe >= 0 and not f.prefilled)
        now = time.monotonic()
        for eid in sorted(self._draining):
            e = self.engines.get(eid)
            if e is None or not e.alive:
                self._draining.discard(eid)
            elif eid not in busy or now >= e.drain_until:
                self._draining.discard(eid)
                self._dead(eid, "left")

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
        # only the records engines send carry ``eid``: one probe of the union (the hot path)
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

    def _flight_of(self, msg: First | Done | ReadFailed) -> Flight | None:
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
            if f.ticket.stream is not None:  # a streamed turn's text starts here
                f.ticket.stream.put(0, (msg.token,))

    def _on_tokens(self, e: EngineState, msg: Tokens, now: float) -> None:
        """A DE's step of its streamed turns: each to its turn's ticket (a stale attempt's
        or a gone turn's dropped)."""
        flights = self.flights
        for rid, att, start, tokens in zip(msg.rids, msg.atts, msg.starts, msg.tokens,
                                           strict=True):
            f = flights.get(rid)
            if f is not None and f.att == att and f.ticket.stream is not None:
                f.ticket.stream.put(start, tokens)

    def cancel(self, rid: int, error: Exception | None = None) -> None:
        """Drop turn ``rid``: its engines are told to free what they hold, its ticket fails
        with ``error`` (None: its caller gave it up, :class:`TurnCancelled`; else the
        answer the service gave it, e.g. a 503 after ``scheduler.no_engine_wait``, so it
        never runs later for nobody). Rare: linear in the queues."""
        with self._lock:
            f = self.flights.get(rid)
            if f is None:
                return
            self._unqueue(f)
            if f in self.queue:
                self.queue.remove(f)
            self._load_delta(f, -1)
            del self.flights[rid]
            self.ledger.forget(rid)
            if error is None:
                self.registry.counter("dualpath_scheduler_cancelled_turns_total").inc()
                error = TurnCancelled(f"turn {rid} was cancelled by its caller")
            f.ticket.fail(error)

    def _on_done(self, e: EngineState, msg: Done, now: float) -> None:
        f = self._flight_of(msg)
        if f is not None:
            self._finish(f, msg)

    def _on_read_failed(self, e: EngineState, msg: ReadFailed, now: float) -> None:
        f = self._flight_of(msg)
        if f is not None:
            if msg.block >= 0:
                self.ledger.failed(f.rid, msg.block, msg.why, f.keys)
            lost_on = kv_loss_engine(msg, f.pe, f.de)
            if lost_on is not None and lost_on in self.engines:
                self.engines[lost_on].kv_lost += 1  # diagnose's fabric workflow counts it
            self._requeue(f, "kv_lost" if lost_on is not None else "read_failed",
                          max_hit=msg.block if msg.block >= 0 else None)

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

    def _finish(self, f: Flight, m: Done) -> None:
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
        e.drain_until = 0.0
        self._draining.discard(engine_id)
        self.last_gone[e.role] = (f"{e.name or f'engine {e.engine_id}'} "
                                  f"{_GONE_WORDS.get(why, why)}")
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

