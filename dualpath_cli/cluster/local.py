"""Local process cluster: one child process per engine (the embedded default).

Children are started with the ``spawn`` method (no inherited sockets or threads) and limit
BLAS to one thread. A supervisor thread waits on the children's sentinels, so an engine that
dies is reported at once (the scheduler's heartbeat timeout is the second line of defence).

Engines die with their launcher, even when it is SIGKILLed: each child watches the pipe that
``spawn`` keeps open to its parent (the parent sentinel) on a daemon thread and exits when it
closes. (A watchdog rather than ``prctl(PR_SET_PDEATHSIG)``, which fires when the *thread*
that started the child ends and exists only on Linux.) With no child left, multiprocessing's
resource tracker then unlinks the launcher's named semaphores (no ``/dev/shm/sem.mp-*``).
The tracker is no help when it is killed too (a ``SIGKILL`` to the launcher's process
group), so the shared NIC buckets' semaphore names are unlinked as soon as every engine has
opened them (:func:`~dualpath_cli.transfer.shaping.unlink_shared`): a kill then leaves none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

from dualpath_cli.errors import DualPathError
from dualpath_cli.runtime.context import EngineSpec
from dualpath_cli.storage import TokenBucket
from dualpath_cli.transfer.shaping import SharedTokenBucket, unlink_shared

__all__ = ["LocalCluster", "EngineFailed", "engine_main", "exit_with_parent", "dead_role",
           "describe_exits"]

#: Exit code of an engine whose launcher died.
ORPHAN_EXIT = 70


class EngineFailed(DualPathError):
    """Engines the run needs have died (during start-up, or every engine of a role)."""


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def describe_exits(exited: dict[int, int]) -> str:
    """``engine 0 (killed by SIGKILL), engine 2 (exit code 1)`` for an ``exited()`` map."""
    return ", ".join(f"engine {eid} ({_how(code)})" for eid, code in sorted(exited.items()))


def dead_role(exited: dict[int, int], roles: dict[str, list[int]]) -> str | None:
    """The first role whose engines have all exited, as a one-line reason; else None.

    With no engine of a role left no turn can finish, so a run stops with this instead of
    waiting out its per-turn timeout.
    """
    for role, ids in roles.items():
        if ids and all(i in exited for i in ids):
            gone = describe_exits({i: exited[i] for i in ids})
            return (f"every {role} engine has died ({gone}); no turn can finish, so the run "
                    "stops here")
    return None


def exit_with_parent() -> None:
    """In a spawned child: exit at once when the parent process ends (any way it ends)."""
    parent = mp.parent_process()
    if parent is None:
        return
    sentinel = parent.sentinel

    def watch() -> None:
        multiprocessing.connection.wait([sentinel])
        os._exit(ORPHAN_EXIT)

    threading.Thread(target=watch, daemon=True, name="parent-watchdog").start()


def engine_main(spec: EngineSpec, opened: Any = None) -> None:
    """Child-process entry: single-threaded BLAS, ZeroMQ fabric, reference model.

    ``opened``: a pipe end closed at once, telling the launcher that the arguments (the NIC
    buckets' semaphores among them) are unpickled and open (:func:`unlink_when_opened`).
    """
    if opened is not None:
        opened.close()
    exit_with_parent()
    from dualpath_cli.runtime.model.threads import limit_blas_threads

    limit_blas_threads(1)
    from dualpath_cli.runtime.engine import run_engine
    from dualpath_cli.runtime.model import load_model
    from dualpath_cli.transfer import ZmqFabric

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher stops us
    run_engine(spec, ZmqFabric(curve=spec.curve), load_model)


def unlink_when_opened(opened: list[Any], buckets: list[Any]) -> threading.Thread | None:
    """Unlink the shared buckets' semaphore names once each child has opened them.

    ``opened`` holds, per child, the reading end of a pipe whose writing end the child got
    as an argument: it reads EOF when the child closed it (its arguments are unpickled, so
    its semaphores are open) or died (it needs them no more). A daemon thread waits for
    that; the thread, or None when no bucket is shared (the pipes are closed then).
    """
    if not any(isinstance(b, SharedTokenBucket) for b in buckets):
        for conn in opened:
            conn.close()
        return None

    def wait() -> None:
        pending = list(opened)
        while pending:
            for conn in multiprocessing.connection.wait(pending):
                pending.remove(conn)
                conn.close()  # type: ignore[union-attr]
        unlink_shared(buckets)

    th = threading.Thread(target=wait, daemon=True, name="semaphore-unlinker")
    th.start()
    return th


def own_bucket(bucket: TokenBucket, fresh: dict[int, TokenBucket]) -> TokenBucket:
    """``bucket``, or a new shared bucket of its rate when it is a shared bucket whose
    semaphore name is gone (it cannot be passed to a new process any more); ``fresh`` keeps
    the new one per old bucket, so a bucket that two fields share stays one bucket."""
    if isinstance(bucket, SharedTokenBucket) and bucket.semaphore is None:
        if id(bucket) not in fresh:
            fresh[id(bucket)] = SharedTokenBucket(bucket.rate, bucket.burst_bytes)
        return fresh[id(bucket)]
    return bucket


def spec_buckets(specs: list[EngineSpec]) -> list[Any]:
    """Every NIC bucket the specs carry (a node's storage NICs repeat: unlinked once)."""
    return [b for s in specs for b in (s.snic_read, s.snic_write, s.cnic)]


@contextlib.contextmanager
def _bare_main() -> Iterator[None]:
    """Spawn children without re-running ``__main__`` in them.

    ``spawn`` re-imports the parent's main module in every child; under ``dualpath launch``
    that is the whole CLI (typer, rich, every command), about a second per engine of
    launch-to-ready, for nothing: :func:`engine_main` lives here.
    """
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


class LocalCluster:
    """Starts engine processes and reports unexpected exits through ``on_death``."""

    def __init__(self, on_death: Callable[[int], None] | None = None) -> None:
        self.on_death = on_death
        self._procs: dict[int, Any] = {}
        #: processes a restart replaced: (engine id, pid, exit code), oldest first
        self.replaced: list[tuple[int, int, int | None]] = []
        self._reported: set[int] = set()  # pids whose exit was reported through on_death
        self._procs_lock = threading.Lock()
        self._closing = threading.Event()
        self._ctx = mp.get_context("spawn")
        self._watch: threading.Thread | None = None
        #: unlinks the shared NIC buckets' semaphore names once the engines opened them
        self.unlinker: threading.Thread | None = None

    def start(self, specs: list[EngineSpec]) -> None:
        from dualpath_cli.limits import check

        check("engines", len(specs), f"{len(specs)} engine processes")  # before any spawn
        env_keep = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        opened: list[Any] = []
        try:
            with _bare_main():
                for spec in specs:
                    opened.append(self._spawn(spec))
        finally:
            for k, v in env_keep.items():
                if v is None:
                    os.environ.pop(k, None)
            # also after a failed spawn: the started engines have (or will have) opened them
            self.unlinker = unlink_when_opened(opened, spec_buckets(specs))
        self._watch = threading.Thread(target=self._supervise, daemon=True,
                                       name="cluster-supervisor")
        self._watch.start()

    def wait_unlinked(self, timeout: float) -> bool:
        """Wait (bounded) until the shared buckets' semaphore names are unlinked; whether
        they are. Once every engine said hello they have all opened them, so this is quick;
        the system waits for it before it calls itself started, so a SIGKILL to the whole
        process group right after "ready" leaves no ``/dev/shm/sem.mp-*`` behind."""
        th = self.unlinker
        if th is None:
            return True
        th.join(timeout)
        return not th.is_alive()

    def _spawn(self, spec: EngineSpec) -> Any:
        """Start one engine's process (under :func:`_bare_main`); the reading end of its
        "arguments opened" pipe (:func:`unlink_when_opened`)."""
        ours, theirs = self._ctx.Pipe(duplex=False)
        p = self._ctx.Process(target=engine_main, args=(spec, theirs),
                              daemon=True, name=f"dualpath-engine-{spec.engine_id}")
        try:
            p.start()
        finally:
            theirs.close()
        with self._procs_lock:
            self._procs[spec.engine_id] = p
        return ours

    def respawn(self, spec: EngineSpec) -> int:
        """Start a new process for a dead engine (a restart); its pid.

        The node's shared NIC buckets were unlinked once every first process had opened them
        (they cannot be passed to a new process), so a restarted engine paces its NICs with
        new buckets at the same rates (unlinked in turn once it opened them): on a node of
        one engine (a launch's default) that is the same NIC; on a node of several, the
        restarted engine no longer shares the node's NIC budget with its siblings.

        Raises:
            EngineFailed: the engine is still running, or the cluster is stopping.
        """
        eid = spec.engine_id
        with self._procs_lock:
            old = self._procs.get(eid)
        if self._closing.is_set():
            raise EngineFailed(f"engine {eid}: not restarted, the cluster is stopping")
        if old is not None and old.exitcode is None:
            old.join(1.0)  # its sentinel fires as it closes its files, just before its exit
        if old is not None and old.exitcode is None:
            raise EngineFailed(f"engine {eid} is still running (pid {old.pid}); not restarted")
        fresh: dict[int, TokenBucket] = {}  # one new bucket per unlinked one (a node's
        # storage NIC is one bucket in two specs' fields)
        spec = dataclasses.replace(spec, snic_read=own_bucket(spec.snic_read, fresh),
                                   snic_write=own_bucket(spec.snic_write, fresh),
                                   cnic=own_bucket(spec.cnic, fresh))
        with _bare_main():
            opened = self._spawn(spec)
        unlink_when_opened([opened], list(fresh.values()))
        if old is not None:
            with self._procs_lock:
                self.replaced.append((eid, int(old.pid), old.exitcode))
        return self.pid(eid)

    def _supervise(self) -> None:
        """Report each process's exit once, through ``on_death``; a respawned engine's new
        process is watched from the next round (every 0.2 s at most)."""
        while not self._closing.is_set():
            with self._procs_lock:
                pending = {p.sentinel: (eid, int(p.pid)) for eid, p in self._procs.items()
                           if int(p.pid) not in self._reported}
            if not pending:
                if self._closing.wait(0.2):
                    return
                continue
            ready = multiprocessing.connection.wait(list(pending), timeout=0.2)
            for sentinel in ready:
                eid, pid = pending[sentinel]
                self._reported.add(pid)
                if not self._closing.is_set() and self.on_death:
                    self.on_death(eid)

    def pid(self, engine_id: int) -> int:
        """OS pid of an engine (its current process)."""
        with self._procs_lock:
            return int(self._procs[engine_id].pid)

    def pids(self) -> dict[int, int]:
        """OS pids of all started engines by engine id (their current processes)."""
        with self._procs_lock:
            return {eid: int(p.pid) for eid, p in self._procs.items()}

    def exited(self) -> dict[int, int]:
        """Engines whose current process has ended, with exit codes (negative: killed by
        signal); a restarted engine is listed again only if its new process ends."""
        with self._procs_lock:
            procs = list(self._procs.items())
        return {eid: int(p.exitcode) for eid, p in procs if p.exitcode is not None}

    def kill(self, engine_id: int) -> None:
        with self._procs_lock:
            proc = self._procs[engine_id]
        proc.kill()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._closing.set()
        with self._procs_lock:
            procs = list(self._procs.values())
        for p in procs:
            p.join(timeout)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(1.0)
