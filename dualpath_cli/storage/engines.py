"""Read engines: how a batch of block reads reaches the kernel.

* ``preadv``: one ``os.preadv`` per block into two aligned iovecs (header, payload). The
  GIL is released during the copy, so several loader threads read in parallel.
* ``io_uring``: a per-thread ring kept full (up to the reader's share of the queue depth)
  and refilled before each completed block is verified — the paper's "io_uring-like
  interface" — using the ``liburing`` PyPI package when it imports and a ring can be
  created on this host (kernels or sandboxes may forbid io_uring). When it cannot,
  :func:`uring_status` says why and ``auto`` falls back to ``preadv``.
"""

from __future__ import annotations

import errno
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

from dualpath_cli.storage.buffers import BlockBuffer
from dualpath_cli.storage.errors import StorageUsageError
from dualpath_cli.storage.header import HEADER_SIZE, payload_checksum
from dualpath_cli.storage.native import NativeHasher, native_reader

__all__ = ["ReadJob", "ReadEngine", "PreadvEngine", "UringEngine", "uring_status",
           "make_engine", "ENGINES", "ChecksumHelper", "OFFLOAD_MIN_BYTES"]

ENGINES: tuple[str, ...] = ("auto", "preadv", "io_uring")


@dataclass(eq=False, slots=True)
class ReadJob:
    """Read ``expected`` bytes at offset 0 of ``fd`` into ``iov``; ``result``: bytes or -errno.

    ``tag`` is the caller's (the store keeps its read operation there); ``path`` names the
    file in error messages.
    """

    fd: int
    iov: list[memoryview]
    expected: int
    result: int = 0
    tag: Any = None
    path: str = ""


class ReadEngine(Protocol):
    """Executes a batch of read jobs; each job's ``result`` is set."""

    name: str

    def run(self, jobs: list[ReadJob], on_done: Callable[[ReadJob], None],
            max_in_flight: int | None = None) -> None:
        """Run every job to completion (short reads are finished with preadv), calling
        ``on_done(job)`` as each completes, while its bytes are still hot in the CPU cache.
        At most ``max_in_flight`` reads are in the kernel at once (default: the engine's)."""
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
    """Synchronous ``preadv`` per job (the portable engine); one read in flight per thread."""

    name = "preadv"

    def run(self, jobs: list[ReadJob], on_done: Callable[[ReadJob], None],
            max_in_flight: int | None = None) -> None:
        """Read each job in order, verifying it right after its read."""
        for job in jobs:
            try:
                job.result = os.preadv(job.fd, job.iov, 0)
            except OSError as err:
                job.result = -(err.errno or errno.EIO)
            if 0 < job.result < job.expected:
                _finish_short(job)
            on_done(job)


# with ``async_buffered``, buffered (page-cache) reads at least this big are punted to
# io_uring's kernel workers (IOSQE_ASYNC), so the copy runs on another core while this thread
# verifies the previous block. Off by default: on the 2-core bench host the hand-off to a
# kernel worker cost more than it overlapped (fio's own force_async=1 halves its QD1 rate).
ASYNC_MIN_BYTES = 256 << 10


class _Ring:
    """One thread's ring, with an eventfd so waiting for completions releases the GIL.

    The ``liburing`` binding holds the GIL inside ``io_uring_wait_cqe``; a reader blocked
    there would stall every other Python thread (the other readers, the engine's callbacks)
    for a whole device latency. Blocking in ``os.eventfd_read`` instead releases it.
    """

    def __init__(self, depth: int) -> None:
        import liburing as L

        self.ring, self.cqe = L.Ring(), L.Cqe()
        L.io_uring_queue_init(depth, self.ring)
        self.efd = os.eventfd(0, os.EFD_CLOEXEC)
        L.io_uring_register_eventfd(self.ring, self.efd)

    def close(self) -> None:
        import liburing as L

        L.io_uring_queue_exit(self.ring)
        os.close(self.efd)


class UringEngine:
    """Pipelined reads through io_uring, one ring per thread (rings are not thread-safe).

    Keeps up to ``max_in_flight`` reads in the ring; as completions arrive it first refills
    the ring from the batch, then verifies the completed blocks, so verification of block
    *i* overlaps the read of block *i+1* even at queue depth 1.

    Args:
        depth: ring size (the most reads one thread can have in flight).
        async_buffered: punt large buffered reads to kernel workers (see ASYNC_MIN_BYTES);
            pointless for O_DIRECT, whose reads are asynchronous already.
    """

    name = "io_uring"

    def __init__(self, depth: int = 64, async_buffered: bool = False) -> None:
        import liburing  # noqa: F401  (fails early when unavailable)

        self.depth = depth
        self.async_buffered = async_buffered
        self._local = threading.local()

    def _ring(self) -> _Ring:
        ring: _Ring | None = getattr(self._local, "ring", None)  # per thread, made on first use
        if ring is None:
            ring = self._local.ring = _Ring(self.depth)
        return ring

    def run(self, jobs: list[ReadJob], on_done: Callable[[ReadJob], None],
            max_in_flight: int | None = None) -> None:
        """Read every job, at most ``max_in_flight`` at a time, verifying as they land."""
        import liburing as L

        r = self._ring()
        ring, cqe, efd = r.ring, r.cqe, r.efd
        limit = max(1, min(self.depth, max_in_flight or self.depth))
        punt = L.IOSQE_ASYNC if self.async_buffered else 0
        iovs: dict[int, Any] = {}  # the kernel reads into these until completion
        total, issued, done = len(jobs), 0, 0

        def refill() -> None:
            nonlocal issued
            first = issued
            while issued < total and len(iovs) < limit:
                job = jobs[issued]
                iov = iovs[issued] = L.Iovec(job.iov)
                sqe = L.io_uring_get_sqe(ring)
                L.io_uring_prep_readv(sqe, job.fd, iov, 0)
                L.io_uring_sqe_set_data64(sqe, issued)
                if punt and job.expected >= ASYNC_MIN_BYTES:
                    L.io_uring_sqe_set_flags(sqe, punt)
                issued += 1
            if issued > first:
                L.io_uring_submit(ring)

        try:
            refill()
            while done < total:
                while not L.io_uring_cq_ready(ring):
                    os.eventfd_read(efd)  # blocks with the GIL released
                landed: list[ReadJob] = []
                while L.io_uring_cq_ready(ring):
                    L.io_uring_peek_cqe(ring, cqe)
                    entry = cqe[0]
                    index = entry.user_data
                    job = jobs[index]
                    job.result = _cqe_result(entry)
                    L.io_uring_cq_advance(ring, 1)
                    del iovs[index]
                    landed.append(job)
                refill()  # the next reads run while these are verified
                for job in landed:
                    if 0 < job.result < job.expected:
                        _finish_short(job)
                    done += 1
                    on_done(job)
        finally:
            # never leave a read in flight into a buffer the caller may reuse
            while iovs:
                while not L.io_uring_cq_ready(ring):
                    os.eventfd_read(efd)
                L.io_uring_peek_cqe(ring, cqe)
                iovs.pop(cqe[0].user_data, None)
                L.io_uring_cq_advance(ring, 1)


def _cqe_result(entry: Any) -> int:
    """A completion's result as bytes or -errno (liburing raises OSError for failures)."""
    try:
        res = entry.res
    except OSError as err:
        return -(err.errno or errno.EIO)
    return int(res) if res is not None else -errno.EIO


@lru_cache(maxsize=1)
def uring_status() -> tuple[bool, str]:
    """(usable, reason): whether io_uring reads work here, checked once by a real read.

    The read is tried in a child process: a liburing build for another CPU dies with SIGILL
    inside its native code (seen with liburing 2026.3.30 on this project's CI machines), and
    that must cost the fallback to ``preadv``, not the process asking.
    """
    try:
        child = subprocess.run(
            [sys.executable, "-c",
             "from dualpath_cli.storage.engines import _probe_uring; "
             "ok, why = _probe_uring(); print(int(ok), why)"],
            capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, f"io_uring probe could not run ({err})"
    if child.returncode < 0:
        name = signal.Signals(-child.returncode).name
        return False, f"liburing crashed the io_uring probe ({name})"
    flag, _, why = child.stdout.strip().partition(" ")
    if child.returncode != 0 or flag not in ("0", "1"):
        last = (child.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"io_uring probe failed ({last})"
    return flag == "1", why


def _probe_uring() -> tuple[bool, str]:
    """The real io_uring read behind :func:`uring_status` (runs in its child process)."""
    try:
        import liburing as L
    except Exception as err:  # noqa: BLE001 - ImportError, or a broken native build
        return False, f"liburing not importable ({type(err).__name__}: {err})"
    try:
        ring, cqe = L.Ring(), L.Cqe()
        L.io_uring_queue_init(4, ring)
    except Exception as err:  # noqa: BLE001 - a probe: any failure means unusable
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
    except Exception as err:  # noqa: BLE001 - a probe: any failure means unusable
        return False, f"io_uring read failed ({err})"
    finally:
        L.io_uring_queue_exit(ring)
    return True, "liburing works"


# payloads at least this big are worth a hand-off to a checksum helper (a 64 KiB payload
# hashes in ~0.6 us, less than the hand-off)
OFFLOAD_MIN_BYTES = 256 << 10


class ChecksumHelper:
    """Computes payload checksums in submission order, on another core.

    A page-cache read is a CPU copy, and so is its checksum: one reader thread does both one
    after the other. With a core to spare (fewer readers than cores), a reader hands its
    batch's payloads here (one hand-off per batch: a thread wake-up costs 25-40 us here),
    reads its next batch while they are hashed, then collects the digests in order with
    :meth:`result`; a block is trusted only when its digest matched. The hashing runs on a
    C thread of the native library when it is available (no Python runs there, so it never
    waits for the GIL), else on a Python thread calling xxh3 (GIL released per payload).
    One reader thread uses a helper.
    """

    def __init__(self) -> None:
        self._batch: list[tuple[BlockBuffer, int]] = []
        self._results: deque[int | BaseException] = deque()
        self.pending = 0  # submitted, not yet collected
        native = native_reader()
        self._native: NativeHasher | None = native.hasher() if native is not None else None
        self._jobs: queue.SimpleQueue[list[tuple[BlockBuffer, int]] | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[list[int | BaseException]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        if self._native is None:
            self._thread = threading.Thread(target=self._run, name="dp-checksum", daemon=True)
            self._thread.start()

    def submit(self, buf: BlockBuffer, nbytes: int) -> None:
        """Add the first ``nbytes`` of ``buf``'s payload to the batch handed over at the next
        :meth:`flush` (the caller keeps the buffer until its result)."""
        self.pending += 1
        self._batch.append((buf, nbytes))

    def flush(self) -> None:
        """Hand the submitted payloads over as one batch (one wake-up)."""
        if not self._batch:
            return
        batch, self._batch = self._batch, []
        if self._native is None:
            self._jobs.put(batch)
            return
        if self._native.busy:  # one batch at a time: keep the earlier digests, in order
            self._results.extend(self._native.wait())
        self._native.submit([b.addr + HEADER_SIZE for b, _ in batch], [n for _, n in batch])

    def result(self) -> int:
        """The digest of the oldest submitted payload not yet collected (waits for it).

        Raises what hashing raised (never corruption: the caller treats it as a failed read);
        either way exactly one submission is consumed, so later results stay in step.
        """
        if not self._results:
            if self._native is not None:
                if not self._native.busy:
                    self.flush()
                self._results.extend(self._native.wait())
            else:
                self.flush()
                self._results.extend(self._done.get())
        out = self._results.popleft()
        self.pending -= 1
        if isinstance(out, BaseException):
            raise out
        return out

    def drain(self) -> None:
        """Collect and drop every outstanding result (after a failed batch)."""
        while self.pending:
            try:
                self.result()
            except Exception:  # noqa: BLE001 - whatever hashing raised: dropped with it
                continue

    def close(self) -> None:
        """Stop the hashing thread (after the outstanding checksums)."""
        if self._native is not None:
            self._native.close()
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()

    def _run(self) -> None:
        get, put = self._jobs.get, self._done.put
        while True:
            batch = get()
            if batch is None:
                return
            put(self._hash(batch))

    def _hash(self, batch: list[tuple[BlockBuffer, int]]) -> list[int | BaseException]:
        out: list[int | BaseException] = []
        for buf, nbytes in batch:
            try:
                out.append(payload_checksum(buf.payload_view(nbytes)))
            except BaseException as err:  # noqa: BLE001 - handed to the reader, never lost
                out.append(err)
        return out


def make_engine(name: str = "auto", depth: int = 64, direct: bool = False) -> ReadEngine:
    """The engine called ``name``.

    ``auto`` picks io_uring for O_DIRECT reads when it is usable (deep queues without a
    thread per read, waits that release the GIL) and preadv threads for page-cache reads:
    there the cost is the memory copy, which ``os.preadv`` does with the GIL released while
    the ``liburing`` binding does it inside ``io_uring_submit`` with the GIL held, so only
    preadv threads spread it over cores.
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
