"""NIC shaping for the embedded runtime, on storage's token bucket.

Why here: every emulated NIC (a node's storage NIC in each direction, an engine's compute NIC)
is the same single-server model as :class:`~dualpath_cli.storage.shaper.TokenBucket`, so the
runtime reuses it instead of keeping its own. Engines of one node may live in different
processes yet share one storage NIC, so :class:`SharedTokenBucket` keeps the bucket's
"next free" time in shared memory; the clock is ``time.monotonic``, which is system-wide.

The shared value's lock is a *named* POSIX semaphore (``/dev/shm/sem.mp-*``): a ``spawn``
child opens it by name when it unpickles the bucket. multiprocessing's resource tracker
unlinks the name when the creator exits, but a ``SIGKILL`` to the creator's whole process
group (a node agent killed as a unit, a Ray worker) kills the tracker too and the name stays
behind. So the creator unlinks it itself (:func:`unlink_shared`) once every process it was
handed to has opened it: an open semaphore keeps working after its name is gone. Until then
the name is noted in a per-user record (:func:`record_dir`, one file per creating process);
the next process on the host that creates a shared bucket unlinks what a dead creator's
record lists (:func:`sweep_stale`), so a kill during start-up leaks nothing for long either.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import multiprocessing.util
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dualpath_cli.atomicio import atomic_write_text
from dualpath_cli.storage.shaper import TokenBucket

__all__ = ["SharedTokenBucket", "make_bucket", "pay", "record_dir", "sweep_stale",
           "unlink_shared"]

_NAME = re.compile(r"/mp-[\w-]+")
_RECORD = re.compile(r"(\d+)-(\d+\.\d+)\.names")
_lock = threading.Lock()
_named: set[str] = set()  # names this process created and has not unlinked
_swept = False


def record_dir() -> Path:
    """Where creators note their not-yet-unlinked semaphore names (one file per process)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"dualpath-sem-{uid}"


def _private_dir() -> Path | None:
    """:func:`record_dir`, created 0700; None when it is not a directory of ours."""
    path = record_dir()
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = path.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        return None
    return path


def _started(pid: int) -> str | None:
    """A process's start time as recorded (None: no such process)."""
    import psutil

    try:
        return f"{psutil.Process(pid).create_time():.2f}"
    except psutil.NoSuchProcess:
        return None
    except psutil.Error:
        return ""  # alive, not ours to read: never swept


def _record_path() -> Path | None:
    base = _private_dir()
    start = _started(os.getpid())
    return base / f"{os.getpid()}-{start}.names" if base is not None and start else None


def _write_record() -> None:
    """Rewrite this process's record from ``_named`` (removed when empty); best effort."""
    path = _record_path()
    if path is None:
        return
    with contextlib.suppress(OSError):
        if _named:
            atomic_write_text(path, "".join(n + "\n" for n in sorted(_named)), mode=0o600,
                              fsync=False)
        else:
            path.unlink(missing_ok=True)
            path.parent.rmdir()  # only when no other process's record is left


def _note(name: str, created: bool) -> None:
    global _swept
    with _lock:
        if not _swept:
            _swept = True
            sweep_stale()
            atexit.register(_forget_all, os.getpid())
        if created:
            _named.add(name)
        else:
            _named.discard(name)
        _write_record()


def _forget_all(pid: int) -> None:
    """At a clean exit multiprocessing unlinks what is left: the record goes."""
    if os.getpid() == pid:
        with _lock:
            _named.clear()
            _write_record()


def sweep_stale() -> int:
    """Unlink the semaphore names that dead creators' records list; how many were there.

    A record whose process still runs (same pid and start time) is left alone.
    """
    from _multiprocessing import sem_unlink

    base = _private_dir()
    if base is None:
        return 0
    n = 0
    for path in base.glob("*.names"):
        m = _RECORD.fullmatch(path.name)
        if m is None or _started(int(m.group(1))) in (m.group(2), ""):
            continue
        try:
            names = path.read_text().split()
        except OSError:
            continue
        for name in names:
            if _NAME.fullmatch(name):
                try:
                    sem_unlink(name)
                    n += 1
                except OSError:
                    pass  # unlinked already (its resource tracker did it)
        with contextlib.suppress(OSError):
            path.unlink()
    with contextlib.suppress(OSError):
        base.rmdir()  # only when empty
    return n


class SharedTokenBucket(TokenBucket):
    """A :class:`TokenBucket` whose timeline is shared by every process it is passed to.

    Pass it to child processes as a ``Process`` argument (spawn); ``rate <= 0`` is unshaped.
    """

    def __init__(self, rate: float | None, burst_bytes: int = 0) -> None:
        super().__init__(rate, burst_bytes)
        self._shared: Any = mp.get_context("spawn").Value("d", 0.0)
        self._unlinked = False
        name = self.semaphore
        if name is not None:  # named (spawn on POSIX): noted until unlinked
            _note(name, True)

    @property
    def semaphore(self) -> str | None:
        """The lock's semaphore name (``/mp-...``); None once unlinked or not named."""
        if self._unlinked:
            return None
        # multiprocessing shows a lock's semaphore name only on its private SemLock
        name = self._shared.get_lock()._semlock.name  # noqa: SLF001 - the stdlib's only view
        return str(name) if name else None

    def unlink(self) -> bool:
        """Remove the semaphore's name now; True if this process created it and it was named.

        Call it once every process that uses the bucket has opened it (they were spawned
        with it and have started): the processes keep sharing the semaphore, but no name is
        left for a kill to leak, and the bucket can no longer be passed to a new process.
        """
        lock = self._shared.get_lock()
        # SemLock registers a finalizer that unlinks the name and tells the resource tracker;
        # run it now (it runs once, so neither a collection nor the exit repeats it); the
        # registry and a finalizer's referent are multiprocessing internals, hence getattr
        registry = getattr(multiprocessing.util, "_finalizer_registry", {})
        for fin in list(registry.values()):
            ref = getattr(fin, "_weakref", None)
            if ref is not None and ref() is lock:
                name = lock._semlock.name  # noqa: SLF001 - as in :attr:`semaphore`
                try:
                    fin()
                except FileNotFoundError:
                    pass  # unlinked already (by hand, or the tracker of a dead parent)
                self._unlinked = True
                _note(name, False)
                return True
        return False

    def reserve(self, nbytes: int, since: float) -> float:
        """Book ``nbytes`` for a transfer started at ``since``; returns its deadline."""
        if self.rate is None:
            return since
        with self._shared.get_lock():
            start = max(self._shared.value, since - self.burst_bytes / self.rate)
            self._shared.value = start + nbytes / self.rate
            return float(self._shared.value)

    def __getstate__(self) -> dict[str, Any]:
        if self._unlinked:
            raise RuntimeError("this shared NIC bucket's semaphore was unlinked: it can no "
                               "longer be passed to a new process")
        state = dict(self.__dict__)
        for name in ("_lock", "clock", "sleep"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self.clock = time.monotonic
        self.sleep = time.sleep


def make_bucket(rate: float, shared: bool) -> TokenBucket:
    """A bucket of ``rate`` bytes/s (``<= 0``: unshaped); ``shared`` for multi-process use."""
    bps = rate if rate > 0 else None
    return SharedTokenBucket(bps) if shared else TokenBucket(bps)


def unlink_shared(buckets: Iterable[object]) -> int:
    """Unlink the semaphore names of the :class:`SharedTokenBucket` among ``buckets`` (each
    once); how many were unlinked. See the module docstring for when."""
    done: set[int] = set()
    n = 0
    for b in buckets:
        if isinstance(b, SharedTokenBucket) and id(b) not in done:
            done.add(id(b))
            n += b.unlink()
    return n


def pay(bucket: TokenBucket, nbytes: int) -> float:
    """Move ``nbytes`` through the NIC: wait until its slot ends; returns seconds waited."""
    if not bucket.enabled or nbytes <= 0:
        return 0.0
    now = bucket.clock()
    deadline = bucket.reserve(nbytes, now)
    bucket.wait_until(deadline)
    return max(0.0, deadline - now)
