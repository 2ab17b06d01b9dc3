"""The shipped fake KVStore: block files kept as bytes in a dict.

It stores exactly the on-disk format (header + padded payload) and verifies reads the same
way as the POSIX store, so tests and users can corrupt, truncate or forge a block in memory
(:meth:`MemoryStore.raw` / :meth:`MemoryStore.set_raw`) and see the same quarantine path.
Bytes held and capacity evictions are recorded like the POSIX store's, so dashboards and tests
see the same ``dualpath_storage_store_bytes`` / ``dualpath_storage_evicted_blocks_total``.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Iterator

import numpy as np

from dualpath_cli.core.layout import BlockKey
from dualpath_cli.storage.buffers import BufferPool
from dualpath_cli.storage.errors import CapacityError, CorruptBlockError
from dualpath_cli.storage.header import BlockHeader, pack_header, padded
from dualpath_cli.storage.store import GcReport, ReadOp, StoreUsage, verify_block
from dualpath_cli.telemetry.registry import REGISTRY, MetricsRegistry

__all__ = ["MemoryStore"]

_ids = itertools.count()


class MemoryStore:
    """In-memory block store with the same semantics as :class:`PosixStore`.

    Args:
        capacity_bytes: byte limit with LRU eviction (None = unlimited).
        registry: metrics registry for bytes held and evictions (default: the process-wide
            one), labelled ``root=memory:<n>``.
    """

    def __init__(self, capacity_bytes: int | None = None,
                 registry: MetricsRegistry = REGISTRY) -> None:
        self.capacity_bytes = capacity_bytes
        self._name = f"memory:{next(_ids)}"
        self._lock = threading.Lock()
        self._blocks: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0  # sum of len(blob) over _blocks, kept so put/usage are O(1)
        self.m_bytes = registry.gauge("dualpath_storage_store_bytes", root=self._name)
        self.m_evicted = registry.counter("dualpath_storage_evicted_blocks_total",
                                          root=self._name)
        self.m_bytes.set(0)
        self._quarantine: dict[str, bytes] = {}
        self._access: dict[str, int] = {}
        self.reads = 0  # store reads served (tests check the DRAM cache in front of it)
        self._removed = 0  # the removal generation: blocks deleted, quarantined or evicted

    @property
    def name(self) -> str:
        """``memory:<n>``."""
        return self._name

    def contains(self, key: BlockKey) -> bool:
        """True when stored."""
        return key.hex in self._blocks

    def put(self, header: BlockHeader, payload: np.ndarray | bytes) -> int:
        """Store a block; 0 when already present."""
        h = header.key.hex
        with self._lock:
            if h in self._blocks:
                self._blocks.move_to_end(h)
                return 0
        data = payload if isinstance(payload, bytes) else payload.tobytes()
        blob = pack_header(header) + data + bytes(padded(len(data)) - len(data))
        with self._lock:
            if self.capacity_bytes is not None:
                if len(blob) > self.capacity_bytes:
                    raise CapacityError(f"block of {len(blob)} bytes exceeds store capacity "
                                        f"{self.capacity_bytes} ({self._name})")
                evicted = 0
                while self._blocks and self._bytes + len(blob) > self.capacity_bytes:
                    self._bytes -= len(self._blocks.popitem(last=False)[1])
                    self._removed += 1
                    evicted += 1
                if evicted:
                    self.m_evicted.inc(evicted)
            old = self._blocks.get(h)  # a concurrent put of the same key: count it once
            self._bytes += len(blob) - (len(old) if old is not None else 0)
            self._blocks[h] = blob
            self.m_bytes.set(self._bytes)
        return len(blob)

    def read_batch(self, ops: list[ReadOp], pool: BufferPool) -> None:
        """Copy each block into a pooled buffer and verify it like a file read."""
        for op in ops:
            h = op.key.hex
            with self._lock:
                blob = self._blocks.get(h)
                if blob is not None:
                    self._blocks.move_to_end(h)
            if blob is None:
                op.missing = True
                continue
            buf = pool.acquire(len(blob))
            buf.data[:len(blob)] = np.frombuffer(blob, dtype=np.uint8)
            self.reads += 1
            try:
                op.header = verify_block(op.key, buf, len(blob), f"{self._name}/{h}")
                op.buffer = buf
                if not op.probe:
                    with self._lock:
                        self._access[h] = self._access.get(h, 0) + 1
            except CorruptBlockError as err:
                buf.release()
                op.error = err
                self.quarantine(op.key, err.reason)

    def delete(self, key: BlockKey) -> bool:
        """Remove a block."""
        with self._lock:
            blob = self._blocks.pop(key.hex, None)
            if blob is None:
                return False
            self._removed += 1
            self._bytes -= len(blob)
            self.m_bytes.set(self._bytes)
        return True

    def removals(self) -> int:
        """The removal generation (:class:`~dualpath_cli.storage.store.CountsRemovals`):
        blocks removed so far (deleted, quarantined or evicted)."""
        with self._lock:
            return self._removed

    def keys(self) -> Iterator[BlockKey]:
        """Stored keys, least recently used first."""
        with self._lock:
            hexes = list(self._blocks)
        return (BlockKey.from_hex(h) for h in hexes)

    def usage(self) -> StoreUsage:
        """Blocks and bytes."""
        with self._lock:
            return StoreUsage(len(self._blocks), self._bytes, self.capacity_bytes)

    def quarantine(self, key: BlockKey, reason: str) -> str | None:
        """Move a block aside."""
        with self._lock:
            blob = self._blocks.pop(key.hex, None)
            if blob is None:
                return None
            self._removed += 1
            self._bytes -= len(blob)
            self.m_bytes.set(self._bytes)
            self._quarantine[f"{key.hex}.{reason}"] = blob
        return f"{self._name}/quarantine/{key.hex}.{reason}"

    def quarantined(self) -> list[str]:
        """Quarantined entries."""
        return sorted(self._quarantine)

    def access_counts(self) -> dict[BlockKey, int]:
        """Reads per block."""
        with self._lock:
            return {BlockKey.from_hex(h): n for h, n in self._access.items()}

    def gc(self, capacity_bytes: int | None = None, purge_quarantine: bool = False) -> GcReport:
        """Evict LRU blocks down to a capacity; optionally drop quarantine."""
        report = GcReport()
        limit = capacity_bytes if capacity_bytes is not None else self.capacity_bytes
        with self._lock:
            if limit is not None:
                while self._blocks and self._bytes > limit:
                    size = len(self._blocks.popitem(last=False)[1])
                    self._bytes -= size
                    self._removed += 1
                    report.evicted_blocks += 1
                    report.evicted_bytes += size
                self.m_bytes.set(self._bytes)
            if purge_quarantine:
                report.quarantine_files = len(self._quarantine)
                self._quarantine.clear()
        if report.evicted_blocks:
            self.m_evicted.inc(report.evicted_blocks)
        return report

    # --- test helpers: the stored bytes, to corrupt on purpose ------------------------------
    def raw(self, key: BlockKey) -> bytes:
        """The stored file bytes of ``key``."""
        return self._blocks[key.hex]

    def set_raw(self, key: BlockKey, blob: bytes) -> None:
        """Replace the stored bytes of ``key`` (to simulate corruption)."""
        with self._lock:
            old = self._blocks.get(key.hex)
            self._bytes += len(blob) - (len(old) if old is not None else 0)
            self._blocks[key.hex] = blob
            self.m_bytes.set(self._bytes)
