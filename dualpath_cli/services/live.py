"""A live cluster: one RuntimeSystem that keeps serving until told to stop.

Why a service apart from the system: ``dualpath bench`` starts a system inside one ``with``
block; a launched cluster instead admits turns from many clients (HTTP, the bench driver)
for as long as it runs, maps each client session to its own agent (so turn n+1 extends turn
n's prefix chain and hits its blocks), answers the read model (``view``, ``decisions``),
accepts guarded control (``update_scheduler``) and stops by draining: no new admissions,
in-flight turns finish (bounded by a timeout), then the engines and the store close.

Stopping keeps two promises. Every admitted turn either completes or is answered with
:class:`Draining` (``ticket.wait()`` raises it; front-ends answer HTTP 503 with
``Retry-After``), never left hanging. And nothing half-written is visible in the store: block
writes are atomic (temp file, then rename), engines finish the write they are in before they
obey "stop", and the temp files of an engine that had to be killed are removed here.

The HTTP layer (``dualpath_cli.api``) and ``dualpath launch`` are thin over this.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from dualpath_cli.cluster.join import JoinService
from dualpath_cli.cluster.local import LocalCluster
from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.core.layout import token_ids
from dualpath_cli.errors import DualPathError
from dualpath_cli.faultspec import Fault
from dualpath_cli.runtime.control import SchedulerChange
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.turns import Ticket, TurnCancelled, TurnRequest, TurnResult
from dualpath_cli.services import request_stories
from dualpath_cli.services.restart import LiveCheckpoint, TurnKeys
from dualpath_cli.storage.store import persists_access_counts
from dualpath_cli.telemetry.membership import RoleGap
from dualpath_cli.telemetry.request_ids import RequestAliases
from dualpath_cli.telemetry.view import AuditEntry, ClusterView, Decision

# Ticket and TurnResult: what submit hands back and what its ticket answers (the API waits
# on them without importing the runtime)
__all__ = ["Draining", "EnginesLost", "StartError", "SchedulerChange", "AuditEntry", "DrainResult",
           "LiveCluster", "Ticket", "TurnCancelled", "TurnResult"]

T = TypeVar("T")


class Draining(DualPathError):
    """The cluster is stopping and admits no new turn (retryable elsewhere or later).

    Also the error a turn gets when the drain timeout cut it off. ``retry_after_s`` is the
    HTTP ``Retry-After`` hint.
    """

    exit_code = 3
    retry_after_s = 5


class EnginesLost(Draining):
    """Every engine of a role has died: no admitted turn can finish (HTTP 503).

    Why: without it a turn admitted after (or running when) the only prefill engine was
    killed waited out its client's timeout with no message (issue 17).
    """


class StartError(DualPathError):
    """The engines did not all come up (one exited, or the start timed out)."""


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What stopping did: turns that finished while draining, and those cut off."""

    drained: int
    abandoned: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (what the launcher leaves for ``dualpath stop``)."""
        return {"drained": self.drained, "abandoned": self.abandoned,
                "seconds": round(self.seconds, 3)}


#: Sessions remembered (least recently used first out): a client that names a new session
#: for every conversation would otherwise grow the map for as long as the cluster runs. A
#: forgotten session's next turn starts a new agent; its stored prefix is still found by
#: content, only the agent's turn count restarts.
SESSIONS_MAX = 65_536


@dataclass
class _Session:
    agent: int
    turns: int = 0


@dataclass
class LiveCluster:
    """A started system plus sessions, admission control and an audit log.

    Args:
        opts: what to start (``processes=True`` and a ``store_dir`` for the embedded default).
        audit: accepted control changes, oldest first (kept for ``/api/v1/status``).
    """

    opts: RuntimeOptions
    audit: list[AuditEntry] = field(default_factory=list)
    checkpoint: Path | None = None
    """Where the scheduler's checkpoint lives (services/restart.py); ``None``: none."""

    def __post_init__(self) -> None:
        self.system = RuntimeSystem(self.opts)
        self.ready_s: float | None = None
        self.state = "starting"
        self._lock = threading.Lock()
        self._sessions: collections.OrderedDict[str, _Session] = collections.OrderedDict()
        self._in_flight: set[Ticket] = set()
        self.aliases = RequestAliases()
        self._prune_at = 256
        self._next_agent = 0
        self._drain: DrainResult | None = None
        self._stop_lock = threading.Lock()
        self._fault_lock = threading.Lock()
        self._t0 = time.monotonic()
        self.turn_keys = TurnKeys()  # Idempotency-Key -> the turn admitted under it
        self.joins = None if self.opts.local_engines else JoinService(self.system)
        # turns waiting for a role with no serving engine are answered after this long
        self.no_engine_wait_s = self.opts.no_engine_wait_s
        self._watch_stop = threading.Event()
        self._watch = threading.Thread(target=self._watch_roles, name="dualpath-roles",
                                       daemon=True)
        # a hierarchical scheduler is not checkpointed (runtime/hierarchy.py): no restart
        self.durable = (LiveCheckpoint(self, self.checkpoint)
                        if self.checkpoint is not None and not self.opts.hierarchical
                        else None)
        cluster = self.system.cluster
        told = cluster.on_death
        # engines the cluster saw exit for good (code may lag): not those it restarts
        self._gone: dict[int, int | None] = {}
        if told is not None:  # after the scheduler hears of a death, check the roles
            def on_death(engine_id: int) -> None:
                told(engine_id)  # the supervisor: the scheduler, then a restart or not
                if engine_id in self.system.supervisor.restarting():
                    return  # its turns wait for it (re-queued), bounded by no_engine_wait
                self._gone[engine_id] = self.system.cluster.exited().get(engine_id)
                self._fail_if_role_lost()

            cluster.on_death = on_death

    def start(self, timeout: float = 60.0) -> float:
        """Start engines and the scheduler; returns seconds until every engine said hello.

        Call it from a thread that lives as long as the cluster (the launcher's main thread).

        Raises:
            StartError: an engine exited before its hello, or ``timeout`` passed; the
                engines that did start are stopped again.
        """
        self.spawn()
        return self.wait_ready(timeout)

    def spawn(self) -> None:
        """Start the scheduler and the engine processes, without waiting for their hello.

        Why apart from :meth:`wait_ready`: a launcher does its own start-up work (the HTTP
        app) while the engines import and connect.
        """
        self._t0 = time.monotonic()
        system = self.system
        try:
            if self.durable is not None:  # before the scheduler runs: its queues come back
                self.durable.restore()
            system.scheduler.start()
            system.cluster.start(system.specs)
            self._watch.start()
            if self.durable is not None:
                self.durable.start()
        except BaseException:
            self.close()
            raise

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Wait until every engine said hello (after :meth:`spawn`); seconds since spawn.

        Raises:
            StartError: as :meth:`start` (the cluster is closed again).
        """
        system = self.system
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    system.scheduler.wait_ready(min(0.1, max(0.0, deadline - time.monotonic())))
                    break
                except TimeoutError as err:
                    exited = self._exited()
                    if exited:
                        codes = ", ".join(f"engine {e} (exit code {c})"
                                          for e, c in sorted(exited.items()))
                        raise StartError(f"engines exited during start: {codes}") from None
                    if time.monotonic() >= deadline:
                        raise StartError(f"{err}; see the engine output above") from None
        except BaseException:
            self.close()
            raise
        system.started_at = time.monotonic()
        system.supervisor.arm()  # from now on a dead engine restarts (cluster.restart)
        self.ready_s = time.monotonic() - self._t0
        self.state = "ready"
        return self.ready_s

    def _exited(self) -> dict[int, int]:
        """Engine processes that have exited for good, with their exit codes (in-process:
        none; an engine the launcher restarts is not among them)."""
        return self.system.down()

    def _role_lost(self) -> str | None:
        """Why no turn can finish (every engine of a role has exited), else None."""
        exited: dict[int, int | None] = {**self._gone, **self._exited()}  # the sentinel
        # fires before the exit code is known
        if not exited:
            return None
        for role in ("prefill", "decode"):
            ids = self.system.engine_ids(role)
            if ids and all(i in exited for i in ids):
                gone = ", ".join(f"engine {i} (exited)" if exited[i] is None
                                 else f"engine {i} (exit code {exited[i]})" for i in ids)
                return (f"every {role} engine has died ({gone}); no turn can finish: restart "
                        "the cluster (dualpath stop, then dualpath launch)")
        return None

    def _fail_if_role_lost(self) -> None:
        """Answer every admitted turn with :class:`EnginesLost` once a role has no engine."""
        why = self._role_lost()
        if why is None:
            return
        with self._lock:
            left = [t for t in self._in_flight if not t.event.is_set()]
        for ticket in left:
            self._give_up(ticket, EnginesLost(why))

    def ready(self) -> bool:
        """Serving: every engine said hello and none has exited since (``/readyz``)."""
        return self.readiness()[0]

    def phase(self) -> str:
        """``starting``, ``ready``, ``draining`` or ``stopped``: the lifecycle ``state``
        every surface gives (``/healthz``, ``/readyz``, ``/api/v1/status``, the view,
        ``dualpath status``). ``ready`` here means started; whether turns can be served
        now is :meth:`readiness` (docs/troubleshooting.md, "Liveness and readiness")."""
        if self.state != "ready":
            return self.state
        return "ready" if self.system.scheduler.all_hello() else "starting"

    def readiness(self) -> tuple[bool, str]:
        """The one definition of ready (``/readyz``, ``/healthz``'s ``ready``, ``status``):
        the cluster admits turns (``ready``, not starting, draining or stopped), every engine
        that is the cluster's said hello, none of its processes has exited since, and each
        role has a serving engine (the membership record). The reason when not."""
        if self.state != "ready":
            return False, f"cluster is {self.state}"
        # _gone: engines whose process sentinel fired before their exit code is known
        if self._gone or self._exited():
            return False, "an engine process has exited"
        if not self.system.scheduler.all_hello():
            return False, "cluster is starting"
        gaps = self.missing_roles()
        if gaps:
            return False, gaps
        return True, "ready"

    def missing_roles(self) -> str:
        """The roles with no serving engine, in one line (``no decode engine since
        03:12:07 (D0 left)``), empty when none."""
        return "; ".join(RoleGap(role, since, why).line() for role, (since, why)
                         in sorted(self.system.scheduler.role_gap_list().items()))

    def _no_engine(self, waited: bool) -> EnginesLost | None:
        """The 503 a turn gets when a role has had no serving engine for the bounded wait
        (``scheduler.no_engine_wait``), else None."""
        gaps = self.system.scheduler.role_gap_list()
        if not gaps:
            return None
        since = min(s for s, _ in gaps.values())
        wait = self.no_engine_wait_s
        if time.time() - since < wait:
            return None
        what = self.missing_roles()
        how = (f"waited {wait:g} s (scheduler.no_engine_wait) for one to come back"
               if waited else f"more than scheduler.no_engine_wait ({wait:g} s) ago")
        return EnginesLost(f"{what}; {how}; retry when the node has rejoined")

    def _watch_roles(self) -> None:
        """Answer the turns waiting on a role with no serving engine once the bounded wait
        has passed: no turn waits unbounded for an engine that is not coming back."""
        period = max(0.05, min(0.25, self.no_engine_wait_s / 4))
        while not self._watch_stop.wait(period):
            if self.state == "ready":
                self._answer_role_waiters()

    def _answer_role_waiters(self) -> None:
        """One pass of :meth:`_watch_roles`: once the bounded wait has passed, every turn
        not finished is answered 503 and taken out of the scheduler's queues."""
        err = self._no_engine(waited=True)
        if err is None:
            return
        with self._lock:
            left = [t for t in self._in_flight if not t.event.is_set()]
        for ticket in left:
            self._give_up(ticket, err)

    def _give_up(self, ticket: Ticket, err: Exception) -> None:
        """Answer ``ticket`` with ``err`` and take its turn out of the scheduler's queues:
        a turn answered 503 must not run later for nobody, nor keep the queue long."""
        if ticket.rid is not None:
            self.system.scheduler.cancel(ticket.rid, err)
        if not ticket.event.is_set():  # a restored turn's ticket has no flight
            ticket.fail(err)

    def submit(self, tokens: list[int], gen: int, session: str | None = None,
               key: str | None = None, stream: bool = False) -> Ticket:
        """Admit one turn of ``session`` (a new anonymous agent when ``None``).

        ``stream``: the ticket's :attr:`~Ticket.stream` gets the tokens as the DE makes
        them, and :meth:`Ticket.cancel` gives the turn up (only such turns cost the
        scheduler a message per decode step).

        ``key`` (a client's idempotency key): a turn already admitted under it is returned
        instead of admitting it again (running, or its kept answer; also after a scheduler
        restart), so a client that lost its connection resubmits and gets one answer.

        Raises:
            Draining: the cluster is stopping.
            KeyConflict: ``key`` was used for a different turn.
        """
        with self._lock:
            digest = ""
            if key is not None:
                digest, held = self.turn_keys.find(key, tokens, gen, session)
                if held is not None:
                    return held
            if self.state != "ready":
                raise Draining(f"cluster is {self.state}; not admitting new turns")
            lost = self._role_lost()
            if lost is not None:
                raise EnginesLost(lost)
            gone = self._no_engine(waited=False)
            if gone is not None:
                raise gone
            sess = self._sessions.get(session) if session is not None else None
            if sess is None:
                sess = _Session(self._next_agent)
                self._next_agent += 1
                if session is not None:
                    self._sessions[session] = sess
                    if len(self._sessions) > SESSIONS_MAX:
                        self._sessions.popitem(last=False)
            elif session is not None:
                self._sessions.move_to_end(session)
            turn = sess.turns
            sess.turns += 1
            ticket = self.system.submit(TurnRequest(sess.agent, turn, token_ids(tokens), gen,
                                                    stream))
            self._in_flight.add(ticket)
            if key is not None:
                self.turn_keys.put(key, digest, ticket)
            if len(self._in_flight) >= self._prune_at:  # callers that never call done()
                self._in_flight = {t for t in self._in_flight if not t.event.is_set()}
                self._prune_at = max(256, 2 * len(self._in_flight))
        if self.durable is not None:  # an event set: the checkpoint thread writes it soon
            self.durable.poke()
            if key is not None:
                ticket.add_done_callback(self.durable.poke)
        return ticket

    def export_sessions(self, during: Callable[[], T]
                        ) -> tuple[T, list[tuple[str, int, int]], int]:
        """``during()``'s result, the sessions (name, agent, turns) and the next agent id,
        all under the admission lock: no turn is admitted between them (the checkpoint's
        scheduler section and idempotency keys agree with its sessions)."""
        with self._lock:
            got = during()
            sessions = [(name, s.agent, s.turns) for name, s in self._sessions.items()]
            return got, sessions, self._next_agent

    def import_sessions(self, sessions: Iterable[tuple[str, int, int]], next_agent: int,
                        tickets: Iterable[Ticket], during: Callable[[], T]) -> T:
        """Put a checkpoint's sessions back (before the cluster serves): agents are numbered
        after ``next_agent``, a drain waits on ``tickets`` (the restored turns), and
        ``during()`` runs under the same lock (the idempotency keys); its result."""
        with self._lock:
            for name, agent, turns in sessions:
                self._sessions[name] = _Session(agent, turns)
            self._next_agent = max(self._next_agent, next_agent)
            got = during()
            self._in_flight.update(tickets)
            return got

    def in_flight(self) -> int:
        """Admitted turns that have not finished yet."""
        with self._lock:
            return sum(1 for t in self._in_flight if not t.event.is_set())

    def done(self, ticket: Ticket) -> None:
        """Forget a ticket whose result the caller has taken."""
        with self._lock:
            self._in_flight.discard(ticket)

    def view(self) -> ClusterView:
        """A snapshot of the whole system; its ``state`` is :meth:`phase` (``stopped`` once
        the system stopped), so the view, ``/api/v1/status`` and ``/healthz`` agree."""
        view = self.system.view()
        state = "stopped" if view.state == "stopped" else self.phase()
        return view if view.state == state else replace(view, state=state)

    def decisions(self, since: int = -1) -> list[Decision]:
        """Logged decisions with ``seq > since``, oldest first (bounded by the ring)."""
        return self.system.decisions(since)

    def name_turn(self, rid: int, names: Iterable[str | None]) -> None:
        """Keep ``names`` (the OpenAI body's id, a client's ``x-request-id``) as aliases of
        turn ``rid``: its story lists them and :meth:`request` finds it by any of them."""
        self.aliases.add(rid, names)

    def request(self, request_id: int | str) -> dict[str, Any]:
        """A request's story (``dualpath explain``), by any of its ids
        (:func:`~dualpath_cli.services.request_stories.request_story`)."""
        return request_stories.request_story(self.system, self.aliases, request_id)

    def requests(self, state: str, limit: int, after: int | None = None) -> dict[str, Any]:
        """``GET /api/v1/requests``
        (:func:`~dualpath_cli.services.request_stories.request_listing`)."""
        return request_stories.request_listing(self.system, self.aliases, state, limit, after)

    def update_scheduler(self, change: SchedulerChange, token_id: str) -> AuditEntry:
        """Apply ``change`` to the running scheduler and audit it."""
        old, new = self.system.update_scheduler(change)
        with self._lock:
            entry = AuditEntry(len(self.audit) + 1, time.time(), token_id, "scheduler", old,
                               new)
            self.audit.append(entry)
        return entry

    def faults(self) -> list[dict[str, Any]]:
        """The injected faults in force (``/api/v1/status``'s ``faults``; empty when off)."""
        return [f.to_dict() for f in self.system.faults]

    def set_faults(self, faults: Sequence[Fault], token_id: str) -> AuditEntry:
        """Inject ``faults`` on their engines and audit it (action ``faults``)."""
        with self._fault_lock:
            old, new = self.system.set_faults(faults)
            return self.record_audit("faults", {"faults": old}, {"faults": new}, token_id)

    def clear_faults(self, token_id: str) -> AuditEntry:
        """Undo every injected fault and audit it (action ``faults``)."""
        with self._fault_lock:
            old, new = self.system.clear_faults()
            return self.record_audit("faults", {"faults": old}, {"faults": new}, token_id)

    def clear_fault(self, fault_id: int, token_id: str) -> AuditEntry:
        """Undo the fault numbered ``fault_id`` and audit it (action ``faults``)."""
        with self._fault_lock:
            old, new = self.system.clear_fault(fault_id)
            return self.record_audit("faults", {"faults": old}, {"faults": new}, token_id)

    def compact_hbm(self, engine_id: int, token_id: str) -> AuditEntry:
        """Defragment one engine's HBM pool (the hbm-frag remedy) and audit it (action
        ``compact``; old and new are the engine's HBM facts around it)."""
        old, new = self.system.compact_hbm(engine_id)
        return self.record_audit("compact", old, new, token_id)

    def replicate_blocks(self, blocks: Sequence[str], copies: int | None,
                         token_id: str) -> AuditEntry:
        """Copy hot blocks to the store's replica roots (the long-tail remedy,
        services/replicate.py) and audit it (action ``replicate``)."""
        from dualpath_cli.services.replicate import replicate_blocks

        o = self.system.opts
        old, new = replicate_blocks(o.store_dir, o.replica_dirs, blocks, copies)
        return self.record_audit("replicate", old, new, token_id)

    def record_audit(self, action: str, old: dict[str, Any], new: dict[str, Any],
                     token_id: str) -> AuditEntry:
        """Append a change to the audit log (an action this object does not do itself,
        e.g. a warm-up started by ``/api/v1/storage/warm``)."""
        with self._lock:
            entry = AuditEntry(len(self.audit) + 1, time.time(), token_id, action, old, new)
            self.audit.append(entry)
        return entry

    def drain(self, timeout: float) -> DrainResult:
        """Stop admitting, wait (up to ``timeout``) for in-flight turns, then close.

        Turns still running at the timeout are answered with :class:`Draining`. Idempotent:
        a second call (a second signal) returns the first call's result once it is done.
        """
        with self._stop_lock:
            if self._drain is not None:
                return self._drain
            t0 = time.monotonic()
            with self._lock:
                if self.state != "stopped":
                    self.state = "draining"
                pending = [t for t in self._in_flight if not t.event.is_set()]
            drained = 0
            cut: list[Ticket] = []
            for ticket in pending:
                if ticket.event.wait(max(0.0, timeout - (time.monotonic() - t0))):
                    drained += 1
                else:
                    cut.append(ticket)
            for ticket in cut:
                ticket.fail(Draining(f"the cluster stopped before this turn finished (drain "
                                     f"timeout {timeout:g} s); retry it"))
            self.close()
            self._drain = DrainResult(drained, len(cut), time.monotonic() - t0)
            return self._drain

    def close(self) -> None:
        """Stop engines and the scheduler, flush the store (idempotent).

        Turns still in flight are answered with :class:`Draining` (``drain`` is the polite
        way: it waits for them first).
        """
        with self._lock:
            if self.state == "stopped":
                return
            self.state = "stopped"
            left = [t for t in self._in_flight if not t.event.is_set()]
        self._watch_stop.set()
        if self.durable is not None:  # every admitted turn gets its answer below: nothing
            self.durable.stop(keep=False)  # is left to restore (only kill -9 leaves one)
        for ticket in left:
            ticket.fail(Draining("the cluster stopped before this turn finished; retry it"))
        try:
            self.system.close()
        finally:
            store = self.system.store
            if persists_access_counts(store):
                store.flush_access_counts()
            self._remove_temp_files()

    def _remove_temp_files(self) -> None:
        """Remove block temp files of engines that did not exit cleanly (killed mid-write).

        A temp file is never a visible block (blocks appear by rename), but it is litter;
        its name carries the writer's pid (``.<block>.<pid>.<thread>.tmp``).
        """
        exited = self.system.cluster.exited()
        root = self.system.opts.store_dir  # the store's root (none: a memory store)
        pids = self.system.cluster.pids()
        cut = {pids[eid] for eid, code in exited.items() if code != 0 and eid in pids}
        cluster = self.system.cluster  # and the processes a restart replaced
        if isinstance(cluster, LocalCluster):
            cut.update(pid for _, pid, code in cluster.replaced if code != 0)
        if not cut or root is None:
            return
        for pid in sorted(cut):
            for tmp in Path(root).glob(f"blocks/*/*/.*.{pid}.*.tmp"):
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
