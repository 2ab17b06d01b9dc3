"""The read paths of a POSIX block store: how a batch of block files becomes verified buffers.

:class:`~dualpath_cli.storage.posix.PosixStore` keeps the file layout, writes and byte
accounting and reads through one of these (``store.read_path()``); the loader picks its
reader loop from the capabilities the path implements (:mod:`~dualpath_cli.storage.store`):

* :class:`PageCacheReads` (``preadv`` without O_DIRECT): one read per block, sized by the
  last file read instead of an ``fstat``; a batch in one GIL-free call of the native reader
  (:mod:`~dualpath_cli.storage.native`) once the block size is known, else Python calls.
  Offers :class:`~dualpath_cli.storage.store.SplitReads` (payload checksums on a helper) and
  :class:`~dualpath_cli.storage.store.PipelinedReads` (the native read-then-hash pipeline).
* :class:`EngineReads` (O_DIRECT through ``preadv``): each file sized by ``fstat`` and read
  through the store's engine; a file system refusing O_DIRECT sends its reads to the page
  cache path.
* :class:`UringReads` (io_uring, buffered or O_DIRECT): as :class:`EngineReads`, plus
  :class:`~dualpath_cli.storage.store.BoundedReads` (a long batch, a bounded ring).

Every path hands each block read to :func:`~dualpath_cli.storage.store.verify_block` (the
header, then the payload digest: computed there, or by native code or a checksum helper
over the length the same bytes' header claims); a corrupt block is quarantined through the
store and its op carries the typed error; nothing corrupt is ever handed out.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import TypeVar

from dualpath_cli.core.layout import BlockKey
from dualpath_cli.storage.buffers import BlockBuffer, BufferPool
from dualpath_cli.storage.engines import OFFLOAD_MIN_BYTES, ChecksumHelper, ReadEngine, ReadJob
from dualpath_cli.storage.errors import CorruptBlockError
from dualpath_cli.storage.header import HEADER_SIZE, claimed_file_nbytes, claimed_payload_len
from dualpath_cli.storage.native import NativePipeline, NativeReader, native_reader
from dualpath_cli.storage.store import Deferred, PipedBatch, ReadOp, verify_block

__all__ = ["PageCacheReads", "EngineReads", "UringReads"]

_T = TypeVar("_T")

# what a read path needs from its store: where a key's file is, how to quarantine a block,
# and how to record the blocks read (access counts, LRU order)
FileOf = Callable[[BlockKey], str]
Quarantine = Callable[[BlockKey, str], object]
Record = Callable[[list[ReadOp]], None]


class _Verdicts:
    """Verdicts shared by the paths: a block read is verified (or quarantined) here."""

    def __init__(self, quarantine: Quarantine) -> None:
        self._quarantine = quarantine

    def judge(self, op: ReadOp, buf: BlockBuffer, nread: int, path: str,
              digest: int | None = None) -> None:
        """Verify a block read into ``buf``; the op gets its header and buffer, or the
        typed error (buffer released, file quarantined)."""
        try:
            op.header = verify_block(op.key, buf, nread, path, digest)
        except CorruptBlockError as err:
            self.reject(op, buf, err)
            return
        op.buffer = buf

    def reject(self, op: ReadOp, buf: BlockBuffer | None, err: CorruptBlockError) -> None:
        """A corrupt block: its buffer goes back, its file to quarantine, and the op carries
        the typed error (the loader counts a miss); nothing corrupt is ever handed out."""
        if buf is not None:
            buf.release()
        op.buffer = None
        op.header = None
        op.error = err
        self._quarantine(op.key, err.reason)


class PageCacheReads(_Verdicts):
    """Page-cache reads (``preadv``, no O_DIRECT), natively batched where possible.

    The buffer of a read is sized by the last file read (``size_hint``; block files of a
    store are mostly one size), so the common case is one read and no ``fstat``.
    """

    engine = "preadv"
    waits = False

    def __init__(self, file: FileOf, quarantine: Quarantine, record: Record) -> None:
        super().__init__(quarantine)
        self._file = file
        self._record = record
        self.size_hint = 0  # size of the last block file read

    # --- ReadPath ---------------------------------------------------------------------------
    def read_batch(self, ops: list[ReadOp], pool: BufferPool) -> None:
        """Read and verify every op."""
        self._read(ops, pool, None)
        self._record(ops)

    # --- SplitReads -------------------------------------------------------------------------
    def read_batch_start(self, ops: list[ReadOp], pool: BufferPool,
                         checksums: ChecksumHelper) -> list[Deferred]:
        """First half of :meth:`read_batch` for a reader that overlaps checksums with reads.

        Reads every op; payloads (of at least ``OFFLOAD_MIN_BYTES`` on the Python path) go to
        ``checksums`` instead of being hashed here. They are handed to it as one batch when
        the *next* batch's reads start (or when a result is asked for), so the helper wakes
        while this thread is in a GIL-free read. Those ops come back deferred: a buffer, no
        header, until :meth:`read_batch_finish` verified them.
        """
        deferred = self._read(ops, pool, checksums)
        if not deferred:
            self._record(ops)
        return deferred

    def read_batch_finish(self, ops: list[ReadOp], deferred: list[Deferred],
                          checksums: ChecksumHelper) -> None:
        """Second half: collect the digests in order; a deferred op is verified with its
        digest (a block becomes readable only when it matched, else it is quarantined); a
        payload the helper could not hash is a failed read (a miss, not corruption)."""
        digests: list[int | None] = []
        for _ in deferred:  # all of them first: the helper's results stay in step
            try:
                digests.append(checksums.result())
            except Exception:  # noqa: BLE001 - whatever hashing raised: a failed read
                digests.append(None)
        for (op, nread, path), digest in zip(deferred, digests, strict=True):
            buf = op.buffer
            assert buf is not None
            if digest is None:
                buf.release()
                op.buffer = None
                op.missing, op.io_error = True, f"{path}: payload checksum failed"
                continue
            self.judge(op, buf, nread, path, digest)
        if deferred:
            self._record(ops)

    # --- PipelinedReads ---------------------------------------------------------------------
    def read_pipeline(self) -> NativePipeline | None:
        """A native read-then-hash pipeline for :meth:`read_batch_submit`, or None where the
        native code (with digests) is not available. The caller closes it."""
        native = native_reader()
        return native.pipeline() if native is not None else None

    def read_batch_submit(self, ops: list[ReadOp], pool: BufferPool,
                          pipeline: NativePipeline) -> PipedBatch:
        """Queue a batch's reads on ``pipeline`` and return at once; :meth:`read_batch_collect`
        finishes it. The pipeline reads the files one at a time and hashes the payloads on
        its own threads; every verdict waits for the collect. Before the first read has sized
        the buffers the batch is read here, synchronously, and collect only returns it."""
        if not self.size_hint:
            self._read(ops, pool, None)
            return PipedBatch(ops, pool, [], [], None)
        paths, bufs = self._native_targets(ops, pool)
        job = _into_buffers(pipeline.submit, paths, bufs)
        return PipedBatch(ops, pool, paths, bufs, job)

    def read_batch_collect(self, batch: PipedBatch, pipeline: NativePipeline) -> None:
        """Wait for a submitted batch and verify it exactly as :meth:`read_batch` does."""
        if batch.job is not None:
            nreads, hot = pipeline.collect(batch.job)
            self._settle_native(batch.ops, batch.pool, batch.paths, batch.bufs, nreads, hot,
                                None)
        self._record(batch.ops)

    def read_each(self, ops: list[ReadOp], pool: BufferPool) -> None:
        """Read and verify ``ops`` one after another in Python (no native batch, nothing
        recorded): where O_DIRECT reads were refused, these read them again."""
        self._read_python(ops, pool, None)

    # --- the reads --------------------------------------------------------------------------
    def _read(self, ops: list[ReadOp], pool: BufferPool,
              checksums: ChecksumHelper | None) -> list[Deferred]:
        """Read a batch; payload digests go to ``checksums`` if given.

        The native path reads the whole batch in one GIL-free call once the block size is
        known; otherwise (no native library, the first read of a store) the same reads run
        as Python calls. Either way every block is verified by :func:`verify_block`.
        """
        native = native_reader() if self.size_hint else None
        if native is not None:
            return self._read_native(ops, pool, checksums, native)
        return self._read_python(ops, pool, checksums)

    def _read_native(self, ops: list[ReadOp], pool: BufferPool,
                     checksums: ChecksumHelper | None, native: NativeReader) -> list[Deferred]:
        """One GIL-free native call reads the batch (and, without a helper, hashes each
        payload right after its read)."""
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
        size = self.size_hint
        return [file(op.key) for op in ops], [pool.acquire(size) for _ in ops]

    def _settle_native(self, ops: list[ReadOp], pool: BufferPool, paths: list[str],
                       bufs: list[BlockBuffer], nreads: list[int], hot: list[int | None],
                       checksums: ChecksumHelper | None) -> list[Deferred]:
        """Judge a batch the native code read (``hot``: each payload's digest over the length
        its unchecked header claimed, or None); a file longer than its buffer is read again
        in Python. With ``checksums``, the payloads go to the helper and come back deferred."""
        longer: list[ReadOp] = []
        deferred: list[Deferred] = []
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
                self.size_hint = claimed
                if checksums is not None:
                    op.buffer = buf  # not trusted (no header) until verified with its digest
                    checksums.submit(buf, claimed_payload_len(buf.header) or 0)
                    deferred.append((op, nread, path))
                    continue
            self.judge(op, buf, nread, path, digest)
        if longer:
            self._read_python(longer, pool, None)
        return deferred

    def _read_python(self, ops: list[ReadOp], pool: BufferPool,
                     checksums: ChecksumHelper | None) -> list[Deferred]:
        """Page-cache reads, one after another, each verified right after its read (its bytes
        are still in this core's cache); large payload digests go to ``checksums`` if given."""
        if checksums is not None:
            checksums.flush()  # the previous batch's payloads, before this batch's reads
        deferred: list[Deferred] = []
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
            if checksums is not None:
                claim = claimed_payload_len(buf.header)
                if (claim is not None and claim >= OFFLOAD_MIN_BYTES
                        and HEADER_SIZE + claim <= min(nread, buf.capacity)):
                    checksums.submit(buf, claim)
                    op.buffer = buf
                    deferred.append((op, nread, path))
                    continue
            self.judge(op, buf, nread, path)
        return deferred

    def _pread_whole(self, fd: int, pool: BufferPool) -> tuple[BlockBuffer, int]:
        """Read a whole block file into a pooled buffer; returns (buffer, bytes read).

        A read that fills the buffer while the header claims more was a longer file: it is
        sized with ``fstat`` and read again. A read shorter than the header claims (a signal
        or a FUSE daemon may split reads) is finished before anyone judges the block
        truncated. Raises OSError (the buffer released).
        """
        buf = pool.acquire(self.size_hint or os.fstat(fd).st_size)
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
            self.size_hint = claimed
        return buf, nread


class EngineReads(_Verdicts):
    """Reads through the store's engine, each file sized by ``fstat`` (O_DIRECT preadv; and
    io_uring through :class:`UringReads`).

    A file system that refuses O_DIRECT (``EINVAL``, e.g. a FUSE mount without direct_io)
    turns it off for good (``direct`` becomes False, ``on_refused`` is called) and the
    refused reads are read again: on the page-cache path when there is one, else here.
    """

    def __init__(self, engine: ReadEngine, direct: bool, file: FileOf, quarantine: Quarantine,
                 record: Record, page_cache: PageCacheReads | None = None,
                 on_refused: Callable[[], None] | None = None) -> None:
        super().__init__(quarantine)
        self._engine = engine
        self.direct = direct
        self._file = file
        self._record = record
        self._page_cache = page_cache
        self._on_refused = on_refused

    @property
    def engine(self) -> str:
        """The engine's name."""
        return self._engine.name

    @property
    def waits(self) -> bool:
        """O_DIRECT reads wait on the device."""
        return self.direct

    def read_batch(self, ops: list[ReadOp], pool: BufferPool) -> None:
        """Read and verify every op."""
        self._read(ops, pool, None)
        self._record(ops)

    def _refused(self) -> None:
        if self.direct:
            self.direct = False
            if self._on_refused is not None:
                self._on_refused()

    def _read(self, ops: list[ReadOp], pool: BufferPool, max_in_flight: int | None) -> None:
        """Reads through the engine, at most ``max_in_flight`` in the kernel at once."""
        jobs: list[ReadJob] = []
        retry: list[ReadOp] = []
        direct = self.direct
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
                    self._refused()
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
                    self._refused()
                    retry.append(op)
                else:
                    op.missing = True
                    op.io_error = f"{job.path}: {os.strerror(-job.result)}"
                return
            op.buffer = None  # trusted only once verified
            self.judge(op, buf, job.result, job.path)

        if jobs:
            try:
                self._engine.run(jobs, done, max_in_flight)
            finally:
                for job in jobs:  # jobs never completed (the engine raised): no fd leak
                    if job.fd >= 0:
                        os.close(job.fd)
                        job.fd = -1
                        if job.tag.buffer is not None:
                            job.tag.buffer.release()
                            job.tag.buffer = None
        if retry:  # O_DIRECT refused: read these again without it
            if self._page_cache is not None:
                self._page_cache.read_each(retry, pool)
            else:
                self._read(retry, pool, max_in_flight)


class UringReads(EngineReads):
    """io_uring reads: a batch longer than the ring's share, verified as blocks land."""

    @property
    def waits(self) -> bool:
        """One thread keeps many reads in flight: none waits alone."""
        return False

    def read_batch_bounded(self, ops: list[ReadOp], pool: BufferPool,
                           max_in_flight: int) -> None:
        """Read and verify every op, at most ``max_in_flight`` in the ring at once."""
        self._read(ops, pool, max_in_flight)
        self._record(ops)


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
