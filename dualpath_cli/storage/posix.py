"""A KV store of plain files: one file per Full Block under a two-level fan-out tree.

It only uses POSIX calls that distributed file systems honour (open, pread, rename), so it
works unchanged on a 3FS, Lustre, NFS or any FUSE mount. Writes are atomic (temp file in the
same directory, then rename; optional fsync of file and directory), so a reader sees a whole
block or none. Reads go through a batched engine (preadv or io_uring) into caller-owned
aligned buffers; O_DIRECT is used when asked and silently dropped where the file system
refuses it (most FUSE mounts), which :attr:`PosixStore.direct_active` reports.

Bytes held (``dualpath_storage_store_bytes``) are this process's view: the store is scanned
once, lazily, at its first change (or taken from the LRU index when a capacity keeps one),
then tracked by this process's puts, deletes, evictions and quarantines. A read-only opener
never pays that scan; a scanning ``usage()`` seeds the figure, ``gc`` re-bases it.

Layout under ``root``::

    blocks/ab/cd/<32 hex>.kv     a block (header + payload)
    quarantine/<hex>.<reason>.<ns>.kv   blocks found corrupt, never read again
    .dualpath/access.json        persisted read counts (hot blocks, ``storage inspect``)
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from dualpath_cli.atomicio import atomic_write_text
from dualpath_cli.core.layout import BlockKey
from dualpath_cli.storage.buffers import BlockBuffer, BufferPool
from dualpath_cli.storage.engines import (
    OFFLOAD_MIN_BYTES,
    ChecksumHelper,
    ReadEngine,
    ReadJob,
    make_engine,
)
from dualpath_cli.storage.errors import (
    CapacityError,
    CorruptBlockError,
    StorageError,
    StorageUsageError,
)
from dualpath_cli.storage.header import (
    HEADER_SIZE,
    BlockHeader,
    check_digest,
    check_header,
    claimed_file_nbytes,
    pack_header,
    padded,
    payload_checksum,
)
from dualpath_cli.storage.native import NativePipeline, NativeReader, PipeJob, native_reader
from dualpath_cli.storage.store import GcReport, ReadOp, StoreUsage, check_read
from dualpath_cli.telemetry.registry import REGISTRY, Gauge, MetricsRegistry

__all__ = ["PosixStore", "PipedBatch", "BLOCK_SUFFIX"]

BLOCK_SUFFIX = ".kv"
_TMP_SUFFIX = ".tmp"
_ZERO_PAD = bytes(4096)

_T = TypeVar("_T")

# (op, header, path) of a block whose payload digest a ChecksumHelper is computing
_Unchecked = tuple[ReadOp, BlockHeader, str]


@dataclass(slots=True)
class PipedBatch:
    """A batch queued on a native pipeline: its ops, files and buffers until collected."""

    ops: list[ReadOp]
    pool: BufferPool
    paths: list[str]
    bufs: list[BlockBuffer]
    job: PipeJob | None  # None: already read synchronously


class PosixStore:
    """Block files under ``root``.

    Args:
        root: directory of the store (created if missing).
        direct: open block files with O_DIRECT for reads (bypasses the page cache).
        fsync: fsync each block file and its directory before it becomes visible.
        engine: read engine: ``auto`` (io_uring for O_DIRECT when usable, else preadv),
            ``preadv``, ``io_uring``.
        capacity_bytes: byte limit; a put beyond it evicts least-recently-used blocks.
        queue_depth: io_uring ring depth (reads one thread keeps in flight).
        registry: metrics registry for bytes held and evictions (default: the process-wide
            one), labelled ``root=<root path>``.
    """

    def __init__(self, root: str | os.PathLike[str], *, direct: bool = False,
                 fsync: bool = False, engine: str = "auto", capacity_bytes: int | None = None,
                 queue_depth: int = 64, registry: MetricsRegistry = REGISTRY) -> None:
        self.root = Path(root)
        try:
            (self.root / "blocks").mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StorageUsageError(f"storage root {self.root}: cannot create ({err.strerror})"
                                    ) from None
        if capacity_bytes is not None and capacity_bytes <= 0:
            raise StorageUsageError(f"storage capacity must be positive, got {capacity_bytes}")
        self.direct_requested = direct
        self.direct_active = direct and hasattr(os, "O_DIRECT")
        self.fsync = fsync
        self.capacity_bytes = capacity_bytes
        self.engine: ReadEngine = make_engine(engine, queue_depth, direct)
        self._blocks = str(self.root / "blocks")
        self._size_hint = 0  # size of the last block file read: page-cache reads skip fstat
        self._lock = threading.Lock()
        self._index: OrderedDict[str, int] | None = None  # hex -> file bytes, LRU order
        self._index_bytes = 0
        self._access: dict[str, int] = {}
        self._flushed: dict[str, int] = {}
        self._registry = registry
        self._bytes: int | None = None  # bytes held as tracked here; None until first known
        self._bytes_lock = threading.Lock()  # one baseline scan at a time
        self._m_bytes: Gauge | None = None  # bound when the figure is first known
        self.m_evicted = registry.counter("dualpath_storage_evicted_blocks_total",
                                          root=self.name)
        if capacity_bytes is not None:
            self._ensure_index()
            self._ensure_bytes()

    # --- identity and paths -----------------------------------------------------------------
    @property
    def name(self) -> str:
        """The root path (metric label)."""
        return str(self.root)

    def path(self, key: BlockKey) -> Path:
        """Where the block of ``key`` lives."""
        return Path(self._file(key))

    def _file(self, key: BlockKey) -> str:
        h = key.raw.hex()  # plain strings: pathlib costs more than a 1 MiB page-cache read
        return f"{self._blocks}/{h[:2]}/{h[2:4]}/{h}{BLOCK_SUFFIX}"

    # --- writes -----------------------------------------------------------------------------
    def contains(self, key: BlockKey) -> bool:
        """True when the block file exists (not verified; reads verify)."""
        return os.path.exists(self._file(key))

    def put(self, header: BlockHeader, payload: np.ndarray | bytes) -> int:
        """Write a block atomically; 0 when the key is already stored (keys are content)."""
        path = self.path(header.key)
        if path.exists():
            self._touch(header.key.hex)
            return 0
        self._ensure_bytes()
        size = header.file_nbytes
        if self.capacity_bytes is not None:
            if size > self.capacity_bytes:
                raise CapacityError(f"block of {size} bytes exceeds store capacity "
                                    f"{self.capacity_bytes} ({self.root})")
            self._make_room(size)
        data = payload if isinstance(payload, bytes) else payload.data.cast("B")
        pad = padded(header.payload_len) - header.payload_len
        parts = [pack_header(header), data, _ZERO_PAD[:pad]]
        tmp = path.parent / f".{path.name}.{os.getpid()}.{threading.get_ident()}{_TMP_SUFFIX}"
        try:
            self._write(tmp, parts)
            os.replace(tmp, path)
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._write(tmp, parts)
            os.replace(tmp, path)
        except OSError as err:
            _unlink_quiet(tmp)
            raise StorageError(f"{path}: cannot write block ({err.strerror})") from None
        if self.fsync:
            _fsync_dir(path.parent)
        h = header.key.hex
        with self._lock:
            index = self._index
            if index is None or h not in index:  # a racing put of the same key counts once
                if index is not None:
                    index[h] = size
                    self._index_bytes += size
                self._add_bytes(size)
        return size

    def _write(self, tmp: Path, parts: list[bytes | memoryview]) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            total = sum(len(p) for p in parts)
            written = os.writev(fd, parts)
            if written != total:  # rare: finish with plain writes
                blob = b"".join(bytes(p) for p in parts)
                while written < total:
                    written += os.write(fd, blob[written:])
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    # --- reads ------------------------------------------------------------------------------
    @property
    def pipelined_reads(self) -> bool:
        """True when :meth:`read_batch` honours ``max_in_flight`` with a batch larger than it
        (io_uring keeps that many reads in the ring and verifies as they land), so a loader
        may hand over a longer batch without exceeding its queue depth. False for preadv:
        measured, longer preadv batches did not pay (one reader would take work that another,
        idle one could have read)."""
        return self.engine.name == "io_uring"

    @property
    def sync_reads(self) -> bool:
        """True when reads take the page-cache fast path (``preadv`` engine, no O_DIRECT):
        one ``preadv`` per block, sized by the last file read instead of an ``fstat``, and
        :meth:`read_batch_start` may hand payload checksums to a :class:`ChecksumHelper`."""
        return self.engine.name == "preadv" and not self.direct_active

    def read_batch(self, ops: list[ReadOp], pool: BufferPool,
                   max_in_flight: int | None = None) -> None:
        """Read ``ops`` with one engine call, at most ``max_in_flight`` reads in the kernel at
        once; corrupt blocks are quarantined, never returned."""
        if self.sync_reads:
            self._read_sync(ops, pool, None)
            self._count_hits(ops)
            return
        self._read_engine(ops, pool, max_in_flight)
        self._count_hits(ops)

    def read_batch_start(self, ops: list[ReadOp], pool: BufferPool,
                         checksums: ChecksumHelper | None) -> list[_Unchecked]:
        """First half of :meth:`read_batch` for a reader that overlaps checksums with reads.

        Reads every op and checks each header; payloads (of at least ``OFFLOAD_MIN_BYTES``
        on the Python path) go to ``checksums`` instead of being hashed here. They are handed
        to it as one batch when the *next* batch's reads start (or when a result is asked
        for), so the helper wakes while this thread is in a GIL-free read. Those ops are not
        done: they have a buffer but no header until :meth:`read_batch_finish` has compared
        their digests. Only on the page-cache fast path (:attr:`sync_reads`); otherwise this
        is the whole :meth:`read_batch` and nothing is left to finish.
        """
        if not self.sync_reads:
            self._read_engine(ops, pool, None)
            self._count_hits(ops)
            return []
        unchecked = self._read_sync(ops, pool, checksums)
        if not unchecked:
            self._count_hits(ops)
        return unchecked

    def read_batch_finish(self, ops: list[ReadOp], unchecked: list[_Unchecked],
                          checksums: ChecksumHelper) -> None:
        """Second half: collect the digests in order; a block becomes readable (its header
        set) only when its digest matched, else it is quarantined like any corrupt block."""
        digests: list[int | None] = []
        for _ in unchecked:  # all of them first: the helper's results stay in step
            try:
                digests.append(checksums.result())
            except Exception:  # could not hash (not corruption): the read failed
                digests.append(None)
        for (op, header, path), digest in zip(unchecked, digests, strict=True):
            buf = op.buffer
            try:
                if digest is None:
                    raise OSError(errno.EIO, "payload checksum failed")
                check_digest(header, digest, path)
            except CorruptBlockError as err:
                self._reject(op, buf, err)
                continue
            except OSError as err:
                if buf is not None:
                    buf.release()
                    op.buffer = None
                op.missing, op.io_error = True, f"{path}: {err.strerror}"
                continue
            op.header = header
        if unchecked:
            self._count_hits(ops)

    def _read_sync(self, ops: list[ReadOp], pool: BufferPool,
                   checksums: ChecksumHelper | None) -> list[_Unchecked]:
        """Page-cache reads of a batch; payload digests go to ``checksums`` if given.

        The native path (:mod:`~dualpath_cli.storage.native`) reads the whole batch in one
        GIL-free call once the block size is known; otherwise (no compiler, the first read
        of a store) the same reads and checks run as Python calls.
        """
        native = native_reader() if self._size_hint else None
        if native is not None:
            return self._read_native(ops, pool, checksums, native)
        return self._read_python(ops, pool, checksums)

    def _read_native(self, ops: list[ReadOp], pool: BufferPool,
                     checksums: ChecksumHelper | None, native: NativeReader) -> list[_Unchecked]:
        """One GIL-free native call reads the batch (and, without a helper, hashes each
        payload right after its read); Python checks every header; a block is trusted only
        when its digest (computed here, or by the helper) matched its checked header's."""
        paths, bufs = self._native_targets(ops, pool)
        if checksums is not None:
            # hand over the previous batch's payloads now: the helper wakes while this thread
            # is in the GIL-free read below, so the two never wait for each other's GIL
            checksums.flush()
        digest = checksums is None
        nreads, hot = _into_buffers(
            lambda names, addrs, caps: native.read(names, addrs, caps, digest=digest), paths, bufs)
        return self._settle_native(ops, pool, paths, bufs, nreads, hot, checksums)

    def _native_targets(self, ops: list[ReadOp],
                        pool: BufferPool) -> tuple[list[str], list[BlockBuffer]]:
        """Each op's file and a buffer of the last file size read for it."""
        file = self._file
        return [file(op.key) for op in ops], [pool.acquire(self._size_hint) for _ in ops]

    def _settle_native(self, ops: list[ReadOp], pool: BufferPool, paths: list[str],
                       bufs: list[BlockBuffer], nreads: list[int], hot: list[int | None],
                       checksums: ChecksumHelper | None) -> list[_Unchecked]:
        """Judge a batch the native code read: every header checked here, every digest
        (``hot``, over the length the unchecked header claimed, or None) compared with its
        checked header's; a file longer than its buffer is read again in Python. Without
        ``checksums`` every op ends done (a header and buffer, or a miss); with it, checked
        payloads go to the helper and come back as unchecked ops."""
        checked: list[tuple[ReadOp, BlockHeader, str, BlockBuffer, int | None]] = []
        longer: list[ReadOp] = []
        for op, buf, path, nread, digest in zip(ops, bufs, paths, nreads, hot, strict=True):
            if nread < 0:
                buf.release()
                op.missing = True
                if nread != -errno.ENOENT:
                    op.io_error = f"{path}: {os.strerror(-nread)}"
                continue
            claimed = claimed_file_nbytes(buf.header)
            if nread == buf.capacity and claimed > nread:  # a longer file than the last one
                buf.release()
                longer.append(op)
                continue
            if 0 < claimed <= nread:
                self._size_hint = claimed
            try:
                header = check_header(op.key, buf.header, buf.capacity, nread, path)
            except CorruptBlockError as err:
                self._reject(op, buf, err)
                continue
            checked.append((op, header, path, buf, digest))
        if checksums is not None:
            for op, header, _, buf, _ in checked:
                op.buffer = buf  # not trusted (no header) until its digest matched
                checksums.submit(buf, header.payload_len)
            unchecked = [(op, header, path) for op, header, path, _, _ in checked]
        else:
            unchecked = []
            for op, header, path, buf, digest in checked:
                # the digest covers the length the header claimed when it was read; the
                # checked header says the same (same bytes), else hash again here
                if digest is None:
                    digest = payload_checksum(buf.payload_view(header.payload_len))
                try:
                    check_digest(header, digest, path)
                except CorruptBlockError as err:
                    self._reject(op, buf, err)
                    continue
                op.header, op.buffer = header, buf
        if longer:
            self._read_python(longer, pool, None)
        return unchecked

    # --- pipelined page-cache reads ---------------------------------------------------------
    def read_pipeline(self) -> NativePipeline | None:
        """A native read-then-hash pipeline for :meth:`read_batch_submit`, or None where
        reads do not take the page-cache fast path or the native code (with digests) is not
        available. The caller closes it."""
        if not self.sync_reads:
            return None
        native = native_reader()
        return native.pipeline() if native is not None else None

    def read_batch_submit(self, ops: list[ReadOp], pool: BufferPool,
                          pipeline: NativePipeline) -> PipedBatch:
        """Queue a batch's reads on ``pipeline`` and return at once; :meth:`read_batch_collect`
        finishes it. The pipeline reads the files one at a time and hashes the payloads on
        its own threads; every verdict waits for the collect. Before the first read has sized
        the buffers the batch is read here, synchronously, and collect only returns it."""
        if not self._size_hint:
            self._read_sync(ops, pool, None)
            return PipedBatch(ops, pool, [], [], None)
        paths, bufs = self._native_targets(ops, pool)
        job = _into_buffers(pipeline.submit, paths, bufs)
        return PipedBatch(ops, pool, paths, bufs, job)

    def read_batch_collect(self, batch: PipedBatch, pipeline: NativePipeline) -> None:
        """Wait for a submitted batch and judge it exactly as :meth:`read_batch` does: each
        header checked, each digest compared; corrupt blocks are quarantined, never
        returned."""
        if batch.job is not None:
            nreads, hot = pipeline.collect(batch.job)
            self._settle_native(batch.ops, batch.pool, batch.paths, batch.bufs, nreads, hot,
                                None)
        self._count_hits(batch.ops)

    def _read_python(self, ops: list[ReadOp], pool: BufferPool,
                     checksums: ChecksumHelper | None) -> list[_Unchecked]:
        """Page-cache reads, one after another, each checked right after its read (its bytes
        are still in this core's cache); large payload digests go to ``checksums`` if given."""
        if checksums is not None:
            checksums.flush()  # the previous batch's payloads, before this batch's reads
        unchecked: list[_Unchecked] = []
        file = self._file
        for op in ops:
            path = file(op.key)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                op.missing = True
                continue
            except OSError as err:
                op.missing, op.io_error = True, f"{path}: {err.strerror}"
                continue
            try:
                buf, nread = self._pread_whole(fd, pool)
            except OSError as err:
                op.missing, op.io_error = True, f"{path}: {err.strerror}"
                continue
            finally:
                os.close(fd)
            try:
                header = check_header(op.key, buf.header, buf.capacity, nread, path)
                payload = buf.payload_view(header.payload_len)
                if checksums is not None and header.payload_len >= OFFLOAD_MIN_BYTES:
                    checksums.submit(buf, header.payload_len)
                    op.buffer = buf
                    unchecked.append((op, header, path))
                    continue
                check_digest(header, payload_checksum(payload), path)
            except CorruptBlockError as err:
                self._reject(op, buf, err)
                continue
            op.header, op.buffer = header, buf
        return unchecked

    def _pread_whole(self, fd: int, pool: BufferPool) -> tuple[BlockBuffer, int]:
        """Read a whole block file into a pooled buffer; returns (buffer, bytes read).

        The buffer is sized by the last file read (block files of a store are mostly one
        size), so the common case is one ``preadv`` and no ``fstat``. A read that fills the
        buffer while the header claims more was a longer file: it is sized with ``fstat`` and
        read again. A read shorter than the header claims (a signal or a FUSE daemon may split
        reads) is finished before anyone judges the block truncated. Raises OSError (the
        buffer released).
        """
        buf = pool.acquire(self._size_hint or os.fstat(fd).st_size)
        try:
            nread = os.preadv(fd, buf.iov, 0)
            claimed = claimed_file_nbytes(buf.header)
            if nread == buf.capacity and claimed > nread:
                size = os.fstat(fd).st_size
                if size > nread:  # a longer file than the last one: read it whole
                    buf.release()
                    buf = pool.acquire(size)
                    nread = os.preadv(fd, buf.iov, 0)
            if nread < min(claimed or HEADER_SIZE, buf.capacity):
                nread = _finish_read(fd, buf, nread)
        except OSError:
            buf.release()
            raise
        if 0 < claimed <= nread:  # a size this file really has (never a corrupt claim)
            self._size_hint = claimed
        return buf, nread

    def _reject(self, op: ReadOp, buf: BlockBuffer | None, err: CorruptBlockError) -> None:
        """A corrupt block: its buffer goes back, its file to quarantine, and the op carries
        the typed error (the loader counts a miss); nothing corrupt is ever handed out."""
        if buf is not None:
            buf.release()
        op.buffer = None
        op.error = err
        self.quarantine(op.key, err.reason)

    def _count_hits(self, ops: list[ReadOp]) -> None:
        """Access counts and LRU order of the blocks read."""
        hits = [op.key.hex for op in ops if op.header is not None]
        if hits:
            with self._lock:
                index = self._index
                access = self._access
                for h in hits:
                    access[h] = access.get(h, 0) + 1
                    if index is not None and h in index:
                        index.move_to_end(h)

    def _read_engine(self, ops: list[ReadOp], pool: BufferPool,
                     max_in_flight: int | None) -> None:
        """Reads through the engine (io_uring, or O_DIRECT preadv), sized by ``fstat``."""
        jobs: list[ReadJob] = []
        retry: list[ReadOp] = []
        direct = self.direct_active
        flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
        file = self._file
        for op in ops:
            path = file(op.key)
            try:
                fd = os.open(path, flags)
            except FileNotFoundError:
                op.missing = True
                continue
            except OSError as err:
                if err.errno == errno.EINVAL and direct:
                    self.direct_active = False  # e.g. a FUSE mount without direct_io
                    retry.append(op)
                else:
                    op.missing, op.io_error = True, f"{path}: {err.strerror}"
                continue
            try:
                size = os.fstat(fd).st_size
            except OSError as err:
                os.close(fd)
                op.missing, op.io_error = True, f"{path}: {err.strerror}"
                continue
            buf = pool.acquire(size)
            op.buffer = buf
            jobs.append(ReadJob(fd, [buf.header, buf.payload_iov(size)], size, 0, op, path))

        def done(job: ReadJob) -> None:
            op: ReadOp = job.tag
            os.close(job.fd)
            job.fd = -1
            buf = op.buffer
            assert buf is not None
            if job.result < 0:
                buf.release()
                op.buffer = None
                if -job.result == errno.EINVAL and direct:
                    self.direct_active = False
                    retry.append(op)
                else:
                    op.missing = True
                    op.io_error = f"{job.path}: {os.strerror(-job.result)}"
                return
            try:
                op.header = check_read(op.key, buf, job.result, job.path)
            except CorruptBlockError as err:
                self._reject(op, buf, err)

        if jobs:
            try:
                self.engine.run(jobs, done, max_in_flight)
            finally:
                for job in jobs:  # jobs never completed (the engine raised): no fd leak
                    if job.fd >= 0:
                        os.close(job.fd)
                        job.fd = -1
                        if job.tag.buffer is not None:
                            job.tag.buffer.release()
                            job.tag.buffer = None
        if retry:  # O_DIRECT refused: read these again without it
            if self.sync_reads:
                self._read_python(retry, pool, None)
            else:
                self._read_engine(retry, pool, max_in_flight)

    def verify(self, key: BlockKey) -> BlockHeader | None:
        """Read and check one block; None if missing; raises (after quarantine) if corrupt."""
        op = ReadOp(key)
        self.read_batch([op], BufferPool(0))
        if op.error is not None:
            raise op.error
        if op.buffer is not None:
            op.buffer.release()
        return op.header

    # --- removal, quarantine, capacity ------------------------------------------------------
    def delete(self, key: BlockKey) -> bool:
        """Remove a block file."""
        self._ensure_bytes()
        path = self.path(key)
        try:
            size = os.stat(path).st_size
            os.unlink(path)
        except FileNotFoundError:
            return False
        self._forget(key.hex, size)
        return True

    def quarantine(self, key: BlockKey, reason: str) -> str | None:
        """Move a block file to ``quarantine/`` (kept for post-mortems, never read)."""
        self._ensure_bytes()
        qdir = self.root / "quarantine"
        qdir.mkdir(exist_ok=True)
        dest = qdir / f"{key.hex}.{reason}.{time.time_ns()}{BLOCK_SUFFIX}"
        path = self.path(key)
        try:
            size = os.stat(path).st_size
            os.replace(path, dest)
        except FileNotFoundError:
            return None
        self._forget(key.hex, size)
        return str(dest)

    def quarantined(self) -> list[str]:
        """Files in quarantine."""
        qdir = self.root / "quarantine"
        return sorted(str(p) for p in qdir.iterdir()) if qdir.is_dir() else []

    def _forget(self, h: str, size: int) -> None:
        """A block file of ``size`` bytes is gone (deleted or quarantined)."""
        with self._lock:
            if self._index is not None and h in self._index:
                self._index_bytes -= self._index.pop(h)
            self._add_bytes(-size)

    # --- bytes held (metric) ----------------------------------------------------------------
    def _ensure_bytes(self) -> None:
        """Know the bytes held before the first change: from the index, else one scan."""
        if self._bytes is not None:
            return
        with self._bytes_lock:
            if self._bytes is not None:
                return
            with self._lock:
                known = self._index_bytes if self._index is not None else None
            if known is None:
                known = sum(st.st_size for _, st in self._scan())
            with self._lock:
                self._set_bytes(known)

    def _set_bytes(self, value: int) -> None:
        """Replace the figure and publish it (lock held)."""
        self._bytes = value
        if self._m_bytes is None:
            self._m_bytes = self._registry.gauge("dualpath_storage_store_bytes", root=self.name)
        self._m_bytes.set(value)

    def _add_bytes(self, delta: int) -> None:
        """Track a change once the figure is known (lock held)."""
        if self._bytes is not None:
            self._set_bytes(max(0, self._bytes + delta))

    def _touch(self, h: str) -> None:
        with self._lock:
            if self._index is not None and h in self._index:
                self._index.move_to_end(h)

    def _scan(self) -> Iterator[tuple[str, os.stat_result]]:
        base = self.root / "blocks"
        for top in _subdirs(base):
            for mid in _subdirs(top):
                for entry in os.scandir(mid):
                    if entry.name.endswith(BLOCK_SUFFIX) and not entry.name.startswith("."):
                        try:
                            yield entry.name[:-len(BLOCK_SUFFIX)], entry.stat()
                        except FileNotFoundError:
                            continue

    def _ensure_index(self) -> OrderedDict[str, int]:
        with self._lock:
            if self._index is None:
                found = sorted(self._scan(), key=lambda item: max(item[1].st_atime_ns,
                                                                  item[1].st_mtime_ns))
                self._index = OrderedDict((h, st.st_size) for h, st in found)
                self._index_bytes = sum(self._index.values())
            return self._index

    def _make_room(self, size: int) -> None:
        assert self.capacity_bytes is not None
        self._evict_to(self.capacity_bytes - size)

    def _evict_to(self, limit: int) -> tuple[int, int]:
        index = self._ensure_index()
        blocks = freed = 0
        while True:
            with self._lock:
                if self._index_bytes <= limit or not index:
                    break
                h, size = index.popitem(last=False)
                self._index_bytes -= size
                self._add_bytes(-size)  # gone either way: evicted now or removed elsewhere
            try:
                os.unlink(self.path(BlockKey.from_hex(h)))
                blocks, freed = blocks + 1, freed + size
                self.m_evicted.inc()
            except FileNotFoundError:
                pass
        return blocks, freed

    def keys(self) -> Iterator[BlockKey]:
        """Every stored key."""
        for h, _ in self._scan():
            try:
                yield BlockKey.from_hex(h)
            except ValueError:
                continue

    def usage(self) -> StoreUsage:
        """Blocks and bytes (from the LRU index when kept, else a scan)."""
        with self._lock:
            if self._index is not None:
                return StoreUsage(len(self._index), self._index_bytes, self.capacity_bytes)
        sizes = [st.st_size for _, st in self._scan()]
        if self._bytes is None:
            with self._bytes_lock:  # seed only: while unknown, no change is in flight
                with self._lock:
                    if self._bytes is None:
                        self._set_bytes(sum(sizes))
        return StoreUsage(len(sizes), sum(sizes), self.capacity_bytes)

    def gc(self, capacity_bytes: int | None = None, purge_quarantine: bool = False,
           tmp_max_age_s: float = 600.0) -> GcReport:
        """Evict LRU blocks to ``capacity_bytes`` (default: the store's), remove temp files
        older than ``tmp_max_age_s`` left by crashed writers, optionally empty quarantine."""
        report = GcReport()
        now = time.time()
        for top in _subdirs(self.root / "blocks"):
            for mid in _subdirs(top):
                for entry in os.scandir(mid):
                    if entry.name.endswith(_TMP_SUFFIX):
                        try:
                            if now - entry.stat().st_mtime > tmp_max_age_s:
                                os.unlink(entry.path)
                                report.temp_files += 1
                        except FileNotFoundError:
                            continue
        limit = capacity_bytes if capacity_bytes is not None else self.capacity_bytes
        if limit is not None:
            with self._bytes_lock:
                with self._lock:
                    self._index = None  # rescan: other processes may have written
                self._ensure_index()
                with self._lock:  # re-base on the fresh scan, as the LRU index does
                    self._set_bytes(self._index_bytes)
            report.evicted_blocks, report.evicted_bytes = self._evict_to(limit)
        if purge_quarantine:
            qdir = self.root / "quarantine"
            if qdir.is_dir():
                report.quarantine_files = sum(1 for _ in qdir.iterdir())
                shutil.rmtree(qdir, ignore_errors=True)
        return report

    # --- access counts ----------------------------------------------------------------------
    def access_counts(self) -> dict[BlockKey, int]:
        """Reads per block: persisted counts plus this process's."""
        merged = dict(self._load_counts())
        with self._lock:
            for h, n in self._access.items():
                merged[h] = merged.get(h, 0) + n - self._flushed.get(h, 0)
        return {BlockKey.from_hex(h): n for h, n in merged.items()}

    def flush_access_counts(self) -> None:
        """Merge this process's read counts into ``.dualpath/access.json`` (atomic)."""
        with self._lock:
            delta = {h: n - self._flushed.get(h, 0) for h, n in self._access.items()
                     if n != self._flushed.get(h, 0)}
            self._flushed = dict(self._access)
        if not delta:
            return
        counts = self._load_counts()
        for h, n in delta.items():
            counts[h] = counts.get(h, 0) + n
        meta = self.root / ".dualpath"
        meta.mkdir(exist_ok=True)
        # a unique temp file per writer: engines of one process share a root (in-process
        # cluster) and used to race on a pid-named temp file
        atomic_write_text(meta / "access.json", json.dumps(counts), fsync=False)

    def _load_counts(self) -> dict[str, int]:
        try:
            data = json.loads((self.root / ".dualpath" / "access.json").read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _into_buffers(call: Callable[[list[bytes], list[int], list[int]], _T], paths: list[str],
                  bufs: list[BlockBuffer]) -> _T:
    """``call(encoded paths, buffer addresses, capacities)`` for a native read of ``paths``
    into ``bufs``; the buffers go back to their pool if it raises."""
    try:
        return call([os.fsencode(p) for p in paths], [b.addr for b in bufs],
                    [b.capacity for b in bufs])
    except BaseException:
        for buf in bufs:
            buf.release()
        raise


def _finish_read(fd: int, buf: BlockBuffer, nread: int) -> int:
    """Continue a short read until the buffer is full or the file ends; returns bytes read."""
    whole = buf.data.data
    while nread < buf.capacity:
        got = os.preadv(fd, [whole[nread:]], nread)
        if got <= 0:
            break
        nread += got
    return nread


def _subdirs(path: Path | str) -> list[str]:
    try:
        return [e.path for e in os.scandir(path) if e.is_dir() and len(e.name) == 2]
    except FileNotFoundError:
        return []


def _unlink_quiet(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
