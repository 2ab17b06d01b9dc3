"""A live cluster: one RuntimeSystem that keeps serving until told to stop.

Why a service apart from the system: ``dualpath bench`` starts a system inside one ``with``
block; a launched cluster instead admits turns from many clients (HTTP, the bench driver)
for as long as it runs, maps each client session to its own agent (so turn n+1 extends turn
n's prefix chain and hits its blocks), answers the read model (``view``, ``decisions``),
accepts guarded control (``update_scheduler``) and stops by draining: no new admissions,
in-flight turns finish (bounded by a timeout), then the engines and the store close.

The HTTP layer (``dualpath_cli.api``) and ``dualpath launch`` are thin over this.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.errors import DualPathError
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.scheduler import Ticket, TurnRequest
from dualpath_cli.telemetry.view import ClusterView, Decision

__all__ = ["Draining", "SchedulerChange", "AuditEntry", "DrainResult", "LiveCluster"]


class Draining(DualPathError):
    """The cluster is stopping and admits no new turn (retryable elsewhere or later)."""

    exit_code = 3


@dataclass(frozen=True, slots=True)
class SchedulerChange:
    """A requested change of the running scheduler (``None``: leave as is).

    Thresholds in scheduler units: alpha and beta in tokens, the quota in seconds.
    """

    alpha_tokens: int | None = None
    beta_tokens: int | None = None
    quota_s: float | None = None
    read_side: str | None = None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One accepted control change: when, by which token, old and new values."""

    seq: int
    at: float
    token_id: str
    action: str
    old: dict[str, Any]
    new: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What stopping did: turns that finished while draining, and those cut off."""

    drained: int
    abandoned: int
    seconds: float


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

    def __post_init__(self) -> None:
        self.system = RuntimeSystem(self.opts)
        self.ready_s: float | None = None
        self.state = "starting"
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._in_flight: set[Ticket] = set()
        self._next_agent = 0

    def start(self) -> float:
        """Start engines and the scheduler; returns seconds until every engine said hello."""
        t0 = time.monotonic()
        self.system.start()
        self.ready_s = time.monotonic() - t0
        self.state = "ready"
        return self.ready_s

    def submit(self, tokens: list[int], gen: int, session: str | None = None) -> Ticket:
        """Admit one turn of ``session`` (a new anonymous agent when ``None``).

        Raises:
            Draining: the cluster is stopping.
        """
        with self._lock:
            if self.state != "ready":
                raise Draining(f"cluster is {self.state}; not admitting new turns")
            sess = self._sessions.get(session) if session is not None else None
            if sess is None:
                sess = _Session(self._next_agent)
                self._next_agent += 1
                if session is not None:
                    self._sessions[session] = sess
            turn = sess.turns
            sess.turns += 1
            ticket = self.system.submit(TurnRequest(sess.agent, turn,
                                                    np.asarray(tokens, dtype=np.int64), gen))
            self._in_flight.add(ticket)
        return ticket

    def done(self, ticket: Ticket) -> None:
        """Forget a ticket whose result the caller has taken."""
        with self._lock:
            self._in_flight.discard(ticket)

    def view(self) -> ClusterView:
        """A snapshot of the whole system."""
        return self.system.view()

    def decisions(self, since: int = -1) -> list[Decision]:
        """Logged decisions with ``seq > since``, oldest first (bounded by the ring)."""
        return self.system.decisions(since)

    def update_scheduler(self, change: SchedulerChange, token_id: str) -> AuditEntry:
        """Apply ``change`` to the running scheduler and audit it."""
        old, new = self.system.update_scheduler(change)
        with self._lock:
            entry = AuditEntry(len(self.audit) + 1, time.time(), token_id, "scheduler", old,
                               new)
            self.audit.append(entry)
        return entry

    def drain(self, timeout: float) -> DrainResult:
        """Stop admitting, wait (up to ``timeout``) for in-flight turns, then close."""
        t0 = time.monotonic()
        with self._lock:
            self.state = "draining"
            pending = list(self._in_flight)
        drained = 0
        for ticket in pending:
            left = max(0.0, timeout - (time.monotonic() - t0))
            if ticket.event.wait(left):
                drained += 1
        self.close()
        return DrainResult(drained, len(pending) - drained, time.monotonic() - t0)

    def close(self) -> None:
        """Stop engines and the scheduler (idempotent)."""
        if self.state == "stopped":
            return
        self.state = "stopped"
        self.system.close()
