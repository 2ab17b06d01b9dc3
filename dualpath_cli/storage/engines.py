"""Read engines: how a batch of block reads reaches the kernel.

* ``preadv``: one ``os.preadv`` per block into two aligned iovecs (header, payload). The
  GIL is released during the copy, so several loader threads read in parallel.
* ``io_uring``: the whole batch is submitted to a per-thread ring and reaped together — the
  paper's "io_uring-like interface" — using the ``liburing`` PyPI package when it imports
  and a ring can be created on this host (kernels or sandboxes may forbid io_uring). When it
  cannot, :func:`uring_status` says why and ``auto`` falls back to ``preadv``.
"""

from __future__ import annotations

import errno
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

from dualpath_cli.storage.errors import StorageUsageError

__all__ = ["ReadJob", "ReadEngine", "PreadvEngine", "UringEngine", "uring_status",
           "make_engine", "ENGINES"]

ENGINES: tuple[str, ...] = ("auto", "preadv", "io_uring")


@dataclass(eq=False, slots=True)
class ReadJob:
    """Read ``expected`` bytes at offset 0 of ``fd`` into ``iov``; ``result``: bytes or -errno."""

    fd: int
    iov: list[memoryview]
    expected: int
    result: int = 0


class ReadEngine(Protocol):
    """Executes a batch of read jobs; each job's ``result`` is set."""

    name: str

    def run(self, jobs: list[ReadJob], on_done: Callable[[ReadJob], None]) -> None:
        """Run every job to completion (short reads are finished with preadv), calling
        ``on_done(job)`` as each completes, while its bytes are still hot in the CPU cache."""
        ...


def _finish_short(job: ReadJob) -> None:
    """Complete a short read (a signal or a FUSE daemon may split reads) synchronously."""
    done = job.result
    while 0 < done < job.expected:
        rest: list[memoryview] = []
        skip = done
        for part in job.iov:
            if skip >= len(part):
                skip -= len(part)
                continue
            rest.append(part[skip:])
            skip = 0
        if not rest:
            break
        try:
            got = os.preadv(job.fd, rest, done)
        except OSError as err:
            job.result = -(err.errno or errno.EIO)
            return
        if got <= 0:
            break
        done += got
    job.result = done


class PreadvEngine:
    """Synchronous ``preadv`` per job (the portable engine)."""

    name = "preadv"

    def run(self, jobs: list[ReadJob], on_done: Callable[[ReadJob], None]) -> None:
        """Read each job in order."""
        for job in jobs:
            try:
                job.result = os.preadv(job.fd, job.iov, 0)
            except OSError as err:
                job.result = -(err.errno or errno.EIO)
            if 0 < job.result < job.expected:
                _finish_short(job)
            on_done(job)


class UringEngine:
    """Batched reads through io_uring, one ring per thread (rings are not thread-safe)."""

    name = "io_uring"

    def __init__(self, depth: int = 64) -> None:
        import liburing  # noqa: F401  (fails early when unavailable)

        self.depth = depth
        self._local = threading.local()

    def _ring(self) -> tuple[Any, Any]:
        ring = getattr(self._local, "ring", None)
        if ring is None:
            import liburing as L

            ring, cqe = L.Ring(), L.Cqe()
            L.io_uring_queue_init(self.depth, ring)
            self._local.ring, self._local.cqe = ring, cqe
        return self._local.ring, self._local.cqe

    def run(self, jobs: list[ReadJob], on_done: Callable[[ReadJob], None]) -> None:
        """Submit up to ``depth`` reads at a time and reap their completions together."""
        import liburing as L

        ring, cqe = self._ring()
        for start in range(0, len(jobs), self.depth):
            chunk = jobs[start:start + self.depth]
            keep = []
            for index, job in enumerate(chunk):
                iov = L.Iovec(job.iov)
                keep.append(iov)  # the kernel reads into these until completion
                sqe = L.io_uring_get_sqe(ring)
                L.io_uring_prep_readv(sqe, job.fd, iov, 0)
                L.io_uring_sqe_set_data64(sqe, index)
            L.io_uring_submit(ring)
            pending = len(chunk)
            while pending:
                # one entry at a time: indexing cqe[i] past the first is wrong when the
                # completion ring wraps around
                L.io_uring_wait_cqe(ring, cqe)
                entry = cqe[0]
                job = chunk[entry.user_data]
                job.result = _cqe_result(entry)
                L.io_uring_cq_advance(ring, 1)
                pending -= 1
                if 0 < job.result < job.expected:
                    _finish_short(job)
                on_done(job)
            del keep


def _cqe_result(entry: Any) -> int:
    """A completion's result as bytes or -errno (liburing raises OSError for failures)."""
    try:
        res = entry.res
    except OSError as err:
        return -(err.errno or errno.EIO)
    return int(res) if res is not None else -errno.EIO


@lru_cache(maxsize=1)
def uring_status() -> tuple[bool, str]:
    """(usable, reason): whether io_uring reads work here, checked once by a real read."""
    try:
        import liburing as L
    except Exception as err:  # ImportError, or a broken native build
        return False, f"liburing not importable ({type(err).__name__}: {err})"
    try:
        ring, cqe = L.Ring(), L.Cqe()
        L.io_uring_queue_init(4, ring)
    except Exception as err:
        return False, f"io_uring_setup failed ({err})"
    try:
        with tempfile.TemporaryFile() as probe:
            probe.write(b"dualpath io_uring probe")
            probe.flush()
            fd = os.dup(probe.fileno())
        try:
            buf = bytearray(16)
            iov = L.Iovec([memoryview(buf)])  # must outlive the read
            sqe = L.io_uring_get_sqe(ring)
            L.io_uring_prep_readv(sqe, fd, iov, 0)
            L.io_uring_submit_and_wait(ring, 1)
            L.io_uring_wait_cqe(ring, cqe)
            res = _cqe_result(cqe[0])
            L.io_uring_cq_advance(ring, 1)
            del iov
        finally:
            os.close(fd)
        if res is None or res <= 0:
            return False, f"io_uring read returned {res}"
    except Exception as err:
        return False, f"io_uring read failed ({err})"
    finally:
        L.io_uring_queue_exit(ring)
    return True, "liburing works"


def make_engine(name: str = "auto", depth: int = 64, direct: bool = False) -> ReadEngine:
    """The engine called ``name``.

    ``auto`` picks io_uring for O_DIRECT reads when it is usable (deep queues without a
    thread per read) and preadv threads for page-cache reads, where the cost is the memory
    copy: threads spread it over cores and verify each block while it is still in cache.
    """
    if name not in ENGINES:
        raise StorageUsageError(f"unknown read engine {name!r}; expected one of "
                                f"{', '.join(ENGINES)}")
    if name == "preadv" or (name == "auto" and not direct):
        return PreadvEngine()
    usable, reason = uring_status()
    if usable:
        return UringEngine(depth)
    if name == "io_uring":
        raise StorageUsageError(f"read engine io_uring is not usable here: {reason}")
    return PreadvEngine()
