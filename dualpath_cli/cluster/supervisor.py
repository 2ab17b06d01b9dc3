"""Engine supervision: a dead engine restarts with backoff, a crash-looping one stays down.

Why here: the launcher is the engines' service manager. The cluster reports a death
(``on_death``); this tells the scheduler at once (its turns are re-queued with a new attempt
number: ``SchedulerService.mark_dead``), asks core's pure rule
(:func:`~dualpath_cli.core.restart_policy.decide_restart`) whether and when to restart, and
then registers the engine with the scheduler again (a fresh record: ``joining`` until the
new process says hello, then ``serving``) and starts its new process. Five deaths in 60 s is
a crash loop: the engine stays down, one CRITICAL line goes to the launcher's log and the
membership record says so (diagnose's ``membership`` workflow turns it into a CRITICAL
finding). A restarted engine that says no hello within ``hello_timeout_s`` is killed, which
counts as another death: no restart waits unbounded.

Only a cluster that :class:`~dualpath_cli.cluster.base.Respawns` restarts engines (engines
as processes, what ``launch`` and ``bench`` use); in-process and emulated engines' deaths
stay final.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from dualpath_cli.cluster.base import Cluster, Respawns
from dualpath_cli.core.restart_policy import (
    EngineRecord,
    RestartPolicy,
    decide_restart,
)
from dualpath_cli.runtime.context import EngineSpec
from dualpath_cli.runtime.scheduler_protocol import Scheduler

__all__ = ["EngineSupervisor", "Supervised", "restart_names"]

log = logging.getLogger(__name__)

#: How often the supervisor's thread looks for due restarts and hellos (seconds).
_TICK_S = 0.05


@dataclass
class Supervised:
    """One engine under supervision."""

    spec: EngineSpec
    name: str
    record: EngineRecord = field(default_factory=EngineRecord)
    due: float | None = None  # a restart waits until then (monotonic)
    starting_since: float | None = None  # respawned, no hello yet
    restarts: int = 0
    crash_loop: bool = False
    down_since: float | None = None  # wall clock of the death, until the hello after it


class EngineSupervisor:
    """Restarts a cluster's dead engines (see the module docstring).

    Args:
        scheduler: told of each death, and of each restarted engine before it starts.
        cluster: what runs the engines; restarts happen only if it :class:`Respawns`.
        specs: the engines to supervise.
        names: operator node name of each engine (``P0``), for the log and the record.
        policy: the backoff and crash-loop numbers.
        enabled: ``cluster.restart``; off, a death is only reported to the scheduler.
        hello_timeout_s: a restarted engine silent this long is killed (another death).
    """

    def __init__(self, scheduler: Scheduler, cluster: Cluster, specs: list[EngineSpec],
                 names: dict[int, str], policy: RestartPolicy, *, enabled: bool = True,
                 hello_timeout_s: float = 60.0) -> None:
        self.scheduler = scheduler
        self.cluster = cluster
        self.policy = policy
        self.enabled = enabled and isinstance(cluster, Respawns)
        self.hello_timeout_s = hello_timeout_s
        self._engines = {s.engine_id: Supervised(s, names.get(s.engine_id, "")) for s in specs}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._armed = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="engine-supervisor")

    # -- life ---------------------------------------------------------------------------
    def arm(self) -> None:
        """Start restarting deaths from now on (once the cluster has started: a death during
        start-up fails the start instead)."""
        if self._armed:
            return
        self._armed = True
        now = time.monotonic()
        with self._lock:
            for s in self._engines.values():
                s.record = EngineRecord(started_at=now)
        if self.enabled:
            self._thread.start()

    def stop(self) -> None:
        """Restart nothing more (the cluster stops)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(2.0)

    # -- what the cluster calls ---------------------------------------------------------
    def on_death(self, engine_id: int) -> None:
        """An engine's process ended: the scheduler re-queues its turns now; a restart is
        scheduled, or it is a crash loop."""
        self.scheduler.mark_dead(engine_id)
        with self._lock:
            s = self._engines.get(engine_id)
            if s is not None and s.down_since is None:
                s.down_since = time.time()
        if not (self.enabled and self._armed) or self._stop.is_set():
            return
        self._decide(engine_id, "its process exited")

    def _decide(self, engine_id: int, how: str) -> None:
        now = time.monotonic()
        with self._lock:
            s = self._engines.get(engine_id)
            if s is None or s.crash_loop:
                return
            d = decide_restart(self.policy, s.record, now)
            s.record, s.starting_since = d.record, None
            who = self._who(s)
            if d.crash_loop:
                s.crash_loop, s.due = True, None
                log.critical("%s is crash-looping: %d deaths in %g s; left down (fix its "
                             "cause, then restart the cluster; cluster.restart)", who,
                             d.recent_deaths, self.policy.loop_window_s)
                return
            s.due = now + d.delay_s
        log.warning("%s died (%s); restarting it in %g s (restart %d)", who, how,
                    d.delay_s, s.restarts + 1)
        self._wake.set()

    @staticmethod
    def _who(s: Supervised) -> str:
        return f"engine {s.spec.engine_id}" + (f" ({s.name})" if s.name else "")

    # -- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(_TICK_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            now = time.monotonic()
            with self._lock:
                due = [s for s in self._engines.values()
                       if s.due is not None and s.due <= now]
                starting = [s for s in self._engines.values() if s.starting_since is not None]
            for s in due:
                self._restart(s)
            for s in starting:
                self._check_hello(s, now)

    def _restart(self, s: Supervised) -> None:
        eid = s.spec.engine_id
        spec = s.spec
        with self._lock:  # from due to starting at once: never seen as down for good
            s.due, s.starting_since = None, time.monotonic()
        # a fresh record first, so the new process's hello is taken (dead -> joining)
        self.scheduler.register(eid, spec.role, spec.node, spec.group, s.name)
        try:
            assert isinstance(self.cluster, Respawns)
            pid = self.cluster.respawn(spec)
        except Exception as err:  # noqa: BLE001 - a failed spawn is one more death; the
            # supervisor's thread must outlive it to judge the next one
            if self._stop.is_set():
                return
            log.error("%s: restart failed: %s", self._who(s), err)
            self.scheduler.mark_dead(eid)
            self._decide(eid, "its restart failed")
            return
        with self._lock:
            s.restarts += 1
            s.starting_since = time.monotonic()
            s.record = EngineRecord(s.record.deaths, s.record.streak, s.starting_since)
        self.scheduler.owner(eid).registry.counter(
            "dualpath_engine_restarts_total", role=spec.role).inc()
        log.warning("%s restarted (pid %d, restart %d)", self._who(s), pid, s.restarts)

    def _check_hello(self, s: Supervised, now: float) -> None:
        eid = s.spec.engine_id
        e = self.scheduler.owner(eid).consistent_engines().get(eid)
        if e is not None and e.address and e.alive:
            with self._lock:
                s.starting_since = s.down_since = None
            log.warning("%s is back: said hello after its restart", self._who(s))
            return
        since = s.starting_since
        if since is not None and now - since > self.hello_timeout_s:
            log.error("%s said no hello within %g s of its restart; killing it",
                      self._who(s), self.hello_timeout_s)
            with self._lock:
                s.starting_since = None
            self.cluster.kill(eid)  # its exit comes back through on_death: another death

    # -- what the system reads ----------------------------------------------------------
    def restarting(self) -> set[int]:
        """Engines down or starting again that are coming back (a restart is due, or the
        restarted process has not said hello yet)."""
        with self._lock:
            return {eid for eid, s in self._engines.items()
                    if s.due is not None or s.starting_since is not None}

    def crash_looping(self) -> set[int]:
        """Engines left down after a crash loop."""
        with self._lock:
            return {eid for eid, s in self._engines.items() if s.crash_loop}

    def restarts(self) -> dict[int, int]:
        """Restarts so far by engine id."""
        with self._lock:
            return {eid: s.restarts for eid, s in self._engines.items()}

    def down_by_node(self) -> dict[int, tuple[float, bool]]:
        """Per node index with an engine that died and has not said hello since: the
        earliest such death (wall clock) and whether a restart is under way."""
        out: dict[int, tuple[float, bool]] = {}
        with self._lock:
            for s in self._engines.values():
                if s.down_since is None:
                    continue
                back = s.due is not None or s.starting_since is not None
                since, restarting = out.get(s.spec.node, (s.down_since, False))
                out[s.spec.node] = (min(since, s.down_since), restarting or back)
        return out

    def by_node(self) -> dict[int, tuple[int, bool]]:
        """Per node index: its engines' restarts so far, and whether one crash-loops."""
        out: dict[int, tuple[int, bool]] = {}
        with self._lock:
            for s in self._engines.values():
                n, loop = out.get(s.spec.node, (0, False))
                out[s.spec.node] = (n + s.restarts, loop or s.crash_loop)
        return out


def restart_names(specs: list[EngineSpec]) -> dict[int, str]:
    """``P0``/``D1`` per engine id, as a launch names its nodes."""
    return {s.engine_id: f"{s.role[0].upper()}{s.node}" for s in specs}

