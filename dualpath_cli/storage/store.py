"""The KVStore seam: what every block store offers, and the batched read operation.

Real: :class:`~dualpath_cli.storage.posix.PosixStore` (files; works on 3FS, Lustre, NFS or
FUSE mounts). Fake, shipped: :class:`~dualpath_cli.storage.memory.MemoryStore`. Reads are
batched (:meth:`KVStore.read_batch`) so an io_uring engine can keep many in flight from one
thread and so no thread is woken per small read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from dualpath_cli.core.layout import BlockKey
from dualpath_cli.storage.block import LoadedBlock
from dualpath_cli.storage.buffers import BlockBuffer, BufferPool
from dualpath_cli.storage.errors import CorruptBlockError, TruncatedBlock
from dualpath_cli.storage.header import (
    HEADER_SIZE,
    BlockHeader,
    unpack_header,
    verify_payload,
)

__all__ = ["KVStore", "ReadOp", "StoreUsage", "GcReport", "read_one", "check_read"]


@dataclass(eq=False, slots=True)
class ReadOp:
    """One block read; the store fills exactly one of (header+buffer), missing, error."""

    key: BlockKey
    buffer: BlockBuffer | None = None
    header: BlockHeader | None = None
    missing: bool = False
    error: CorruptBlockError | None = None
    io_error: str | None = None  # a failed read (EIO...): reported as a miss, not quarantined

    @property
    def ok(self) -> bool:
        """True when the block was read and verified."""
        return self.header is not None and self.buffer is not None


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


def check_read(key: BlockKey, buffer: BlockBuffer, nread: int, path: str) -> BlockHeader:
    """Verify a block just read into ``buffer`` (``nread`` bytes); raises when corrupt."""
    if nread < HEADER_SIZE:
        raise TruncatedBlock(path, f"file has {nread} bytes, less than the {HEADER_SIZE}-byte "
                                   "header")
    header = unpack_header(buffer.header, path, expected_key=key)
    if header.file_nbytes > buffer.capacity or nread < HEADER_SIZE + header.payload_len:
        raise TruncatedBlock(path, f"file has {nread} bytes, header says "
                                   f"{HEADER_SIZE + header.payload_len}")
    verify_payload(header, buffer.payload_view(header.payload_len), nread - HEADER_SIZE, path)
    return header
