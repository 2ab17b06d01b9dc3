"""The KVStore seam: what every block store offers, the batched read operation, the optional
read capabilities a loader may use, and the one verification of a block read.

Real: :class:`~dualpath_cli.storage.posix.PosixStore` (files; works on 3FS, Lustre, NFS or
FUSE mounts). Fake, shipped: :class:`~dualpath_cli.storage.memory.MemoryStore`. Reads are
batched (:meth:`KVStore.read_batch`) so an io_uring engine can keep many in flight from one
thread and so no thread is woken per small read.

Every store offers :meth:`KVStore.read_batch`. A store may also hand out its current
:class:`ReadPath` (:class:`ReadPathStore`); the loader picks its reader loop from the
capability protocols that read path implements (checked with ``isinstance``, the store's
own type checked with ``issubclass``, so a wrapper that delegates by ``__getattr__`` keeps
its own ``read_batch``):

* :class:`BoundedReads`: a batch longer than the reads kept in flight (io_uring);
* :class:`SplitReads`: reads now, payload checksums on another core, verdicts later;
* :class:`PipelinedReads`: a batch queued on C threads that read and hash it, judged later.

The implementations live in :mod:`~dualpath_cli.storage.reads`. Whatever the path, a block
is trusted only after :func:`verify_block` passed.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeGuard, runtime_checkable

import numpy as np

from dualpath_cli.core.layout import BlockKey
from dualpath_cli.storage.block import LoadedBlock
from dualpath_cli.storage.buffers import BlockBuffer, BufferPool
from dualpath_cli.storage.errors import CorruptBlockError
from dualpath_cli.storage.header import (
    BlockHeader,
    check_digest,
    check_header,
    payload_checksum,
)

if TYPE_CHECKING:  # types of the optional read capabilities (their implementations)
    from dualpath_cli.storage.engines import ChecksumHelper
    from dualpath_cli.storage.native import NativePipeline, PipeJob

__all__ = ["KVStore", "ReadOp", "StoreUsage", "GcReport", "read_one", "verify_block",
           "ReadPath", "ReadPathStore", "BoundedReads", "SplitReads", "PipelinedReads",
           "PersistsAccessCounts", "read_path_of", "persists_access_counts",
           "CountsCopyReads", "CountsRemovals", "removal_generation", "Deferred", "PipedBatch"]


@dataclass(eq=False, slots=True)
class ReadOp:
    """One block read; the store fills exactly one of (header+buffer), missing, error."""

    key: BlockKey
    buffer: BlockBuffer | None = None
    header: BlockHeader | None = None
    missing: bool = False
    error: CorruptBlockError | None = None
    io_error: str | None = None  # a failed read (EIO...): reported as a miss, not quarantined
    #: corrupt copies found (and quarantined) before another copy served the block: a
    #: replicated store fills it, so that a copy's corruption is counted like a block's
    #: even when the read succeeded (storage/replicas.py)
    copy_errors: tuple[CorruptBlockError, ...] = ()
    #: a health probe's read (storage/probe.py), not a turn's: stores count no access for
    #: it (hot blocks, LRU order, a replicated block's copy reads)
    probe: bool = False

    @property
    def ok(self) -> bool:
        """True when the block was read and verified."""
        return self.header is not None and self.buffer is not None


# an op read whole whose payload digest a ChecksumHelper computes: (op, bytes read, path);
# the op holds its buffer but no header until read_batch_finish verified it (SplitReads)
Deferred = tuple[ReadOp, int, str]


@dataclass(slots=True)
class PipedBatch:
    """A batch queued on a native pipeline (:class:`PipelinedReads`): its ops, files and
    buffers until collected."""

    ops: list[ReadOp]
    pool: BufferPool
    paths: list[str]
    bufs: list[BlockBuffer]
    job: PipeJob | None  # None: already read synchronously


@dataclass(frozen=True, slots=True)
class StoreUsage:
    """Blocks and bytes held, against the capacity (None = unlimited)."""

    blocks: int
    bytes: int
    capacity_bytes: int | None


@dataclass(slots=True)
class GcReport:
    """What ``gc`` removed."""

    evicted_blocks: int = 0
    evicted_bytes: int = 0
    temp_files: int = 0
    quarantine_files: int = 0
    errors: list[str] = field(default_factory=list)


@runtime_checkable
class KVStore(Protocol):
    """A store of Full Blocks addressed by prefix-chain keys."""

    @property
    def name(self) -> str:
        """Identity used in metric labels (a root path or ``memory:<id>``)."""
        ...

    def contains(self, key: BlockKey) -> bool:
        """True when a block file for ``key`` exists (not verified)."""
        ...

    def put(self, header: BlockHeader, payload: np.ndarray | bytes) -> int:
        """Store a block atomically; returns bytes written (0 when already present)."""
        ...

    def read_batch(self, ops: list[ReadOp], pool: BufferPool) -> None:
        """Read every op into a buffer from ``pool``; corrupt blocks are quarantined."""
        ...

    def delete(self, key: BlockKey) -> bool:
        """Remove a block; False when it was not there."""
        ...

    def keys(self) -> Iterator[BlockKey]:
        """Every stored key (any order)."""
        ...

    def usage(self) -> StoreUsage:
        """Blocks and bytes held."""
        ...

    def quarantine(self, key: BlockKey, reason: str) -> str | None:
        """Move a block aside so it is never read again; returns where it went."""
        ...

    def access_counts(self) -> dict[BlockKey, int]:
        """Reads per block since the store was opened (hotspot detection)."""
        ...

    def gc(self, capacity_bytes: int | None = None, purge_quarantine: bool = False) -> GcReport:
        """Evict LRU blocks down to capacity and remove leftovers."""
        ...


@runtime_checkable
class ReadPath(Protocol):
    """How a store reads a batch now: every read path offers a whole, verified batch read."""

    @property
    def engine(self) -> str:
        """Engine name (``preadv``, ``io_uring``): the bench lays fio out like it."""
        ...

    @property
    def waits(self) -> bool:
        """True when each read waits on a device (O_DIRECT without io_uring): more reader
        threads than cores overlap those waits."""
        ...

    def read_batch(self, ops: list[ReadOp], pool: BufferPool) -> None:
        """As :meth:`KVStore.read_batch`."""
        ...


@runtime_checkable
class BoundedReads(ReadPath, Protocol):
    """Capability: reads a batch longer than the reads it keeps in flight (io_uring keeps
    ``max_in_flight`` in the ring and verifies blocks as they land), so a loader may hand
    over more than its queue-depth share without exceeding it."""

    def read_batch_bounded(self, ops: list[ReadOp], pool: BufferPool,
                           max_in_flight: int) -> None:
        """:meth:`ReadPath.read_batch` with at most ``max_in_flight`` reads in the kernel."""
        ...


@runtime_checkable
class SplitReads(ReadPath, Protocol):
    """Capability: a batch read split in two, so a reader with a core to spare reads its
    next batch while a :class:`~dualpath_cli.storage.engines.ChecksumHelper` hashes this
    one's payloads. An op left to finish has a buffer but no header (untrusted)."""

    def read_batch_start(self, ops: list[ReadOp], pool: BufferPool,
                         checksums: ChecksumHelper) -> list[Deferred]:
        """Read every op; those whose digest the helper computes come back deferred."""
        ...

    def read_batch_finish(self, ops: list[ReadOp], deferred: list[Deferred],
                          checksums: ChecksumHelper) -> None:
        """Collect the digests in order and verify the deferred ops."""
        ...


@runtime_checkable
class PipelinedReads(ReadPath, Protocol):
    """Capability: a batch queued on a native read-then-hash pipeline (two C threads) and
    judged when collected, so the caller's Python overlaps the next batches' reads."""

    def read_pipeline(self) -> NativePipeline | None:
        """A pipeline of the caller's own (it closes it), or None where unavailable."""
        ...

    def read_batch_submit(self, ops: list[ReadOp], pool: BufferPool,
                          pipeline: NativePipeline) -> PipedBatch:
        """Queue the batch's reads and return at once."""
        ...

    def read_batch_collect(self, batch: PipedBatch, pipeline: NativePipeline) -> None:
        """Wait for a submitted batch and verify it."""
        ...


@runtime_checkable
class ReadPathStore(Protocol):
    """A store that hands out its current :class:`ReadPath` (check it with ``issubclass``
    on the store's type: methods only)."""

    def read_path(self) -> ReadPath:
        """The path :meth:`KVStore.read_batch` reads through now."""
        ...


@runtime_checkable
class PersistsAccessCounts(Protocol):
    """A store that keeps read counts on disk; a loader flushes them when it closes."""

    def flush_access_counts(self) -> None:
        """Merge this process's read counts into the store's persisted ones."""
        ...


@runtime_checkable
class CountsCopyReads(Protocol):
    """A store with copies of hot blocks that counts each copy's reads (storage/replicas.py):
    the evidence that a replicated block's reads are spread."""

    def copy_reads(self, key: BlockKey) -> dict[str, int]:
        """Reads of ``key`` by the root that served them (empty: one copy)."""
        ...


@runtime_checkable
class CountsRemovals(Protocol):
    """A store that can say whether a block was removed since an earlier moment.

    Why: a prefix lookup stats every leading block of a prompt (hundreds for a long
    agent context), though blocks only disappear when something removes them. A store
    whose every removal path (delete, quarantine, eviction, gc; in any process) moves a
    *removal generation* lets a caller trust blocks it found present at an unchanged
    generation and stat only the rest.
    """

    def removals(self) -> Hashable | None:
        """The removal generation: a value that differs from every earlier one once a
        block has been removed (compare for equality only), or ``None`` when it cannot be
        known (then nothing may be trusted). Read it *before* checking blocks: a block
        found present after the read was present at that generation."""
        ...


def removal_generation(store: object) -> Hashable | None:
    """The store's removal generation when its own type keeps one (:class:`CountsRemovals`,
    by type as :func:`read_path_of`), else ``None`` (unknown: check every block)."""
    return store.removals() if _counts_removals(store) else None


def _counts_removals(store: object) -> TypeGuard[CountsRemovals]:
    return issubclass(type(store), CountsRemovals)


def read_path_of(store: object) -> ReadPath | None:
    """The read path of a store whose own type hands one out (:class:`ReadPathStore`), else
    None. By type, not by instance: a wrapper that delegates the rest of the protocol by
    ``__getattr__`` keeps its own ``read_batch`` and gets no capability of its inner store."""
    return store.read_path() if _hands_out_read_path(store) else None


def _hands_out_read_path(store: object) -> TypeGuard[ReadPathStore]:
    return issubclass(type(store), ReadPathStore)


def persists_access_counts(store: object) -> TypeGuard[PersistsAccessCounts]:
    """True when the store's own type keeps read counts on disk (by type, as
    :func:`read_path_of`)."""
    return issubclass(type(store), PersistsAccessCounts)


def read_one(store: KVStore, key: BlockKey, pool: BufferPool | None = None) -> LoadedBlock | None:
    """Read and verify one block (None when missing; raises when corrupt, after quarantine)."""
    op = ReadOp(key)
    store.read_batch([op], pool or BufferPool(0))
    if op.error is not None:
        raise op.error
    if not op.ok:
        return None
    assert op.header is not None and op.buffer is not None
    return LoadedBlock(key, op.header, op.buffer)


def verify_block(key: BlockKey, buffer: BlockBuffer, nread: int, path: str,
                 digest: int | None = None) -> BlockHeader:
    """The one verification of a block read into ``buffer`` (``nread`` bytes): the header
    (its own checksum, fields, the key, the whole payload read), then the payload's xxh3-64
    against the header's. Raises a typed :class:`CorruptBlockError`.

    ``digest`` is the payload digest when a faster path already computed it (native code or
    a checksum helper, over the payload length the same bytes' header claims, which is the
    checked header's); None computes it here.
    """
    header = check_header(key, buffer.header, buffer.capacity, nread, path)
    if digest is None:
        digest = payload_checksum(buffer.payload_view(header.payload_len))
    check_digest(header, digest, path)
    return header
