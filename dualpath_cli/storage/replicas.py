"""Hot-block replicas across several store roots (the seed's hotspot mitigation).

Agentic workloads re-read the same system-prompt and tool-schema prefixes on every turn, so
a few blocks take most reads and the storage targets holding them saturate. A block's home
is chosen by its key (spread evenly over roots); every read is counted, and a block read
``hot_reads`` times is copied to up to ``replicas`` roots in total. Later reads rotate among
the copies. ``hottest()`` lists the access counts that find such hotspots.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence

import numpy as np

from dualpath_cli.core.layout import BlockKey
from dualpath_cli.storage.buffers import BufferPool
from dualpath_cli.storage.errors import StorageError, StorageUsageError
from dualpath_cli.storage.header import BlockHeader
from dualpath_cli.storage.store import GcReport, KVStore, ReadOp, StoreUsage
from dualpath_cli.telemetry.registry import REGISTRY, MetricsRegistry

__all__ = ["ReplicatedStore"]


class ReplicatedStore:
    """A KVStore over several roots with key-hashed homes and hot-block replicas.

    Args:
        stores: the roots (each a KVStore), at least one.
        hot_reads: reads after which a block gets replicas (0 disables replication).
        replicas: copies of a hot block in total, home included (capped at len(stores)).
    """

    def __init__(self, stores: Sequence[KVStore], hot_reads: int = 8, replicas: int = 2,
                 registry: MetricsRegistry = REGISTRY) -> None:
        if not stores:
            raise StorageUsageError("a replicated store needs at least one root")
        self.stores = list(stores)
        self.hot_reads = hot_reads
        self.replicas = max(1, min(replicas, len(self.stores)))
        self._lock = threading.Lock()
        self._counts: dict[bytes, int] = {}
        self._copies: dict[bytes, list[int]] = {}
        self._rr = itertools.count()
        self._registry = registry

    @property
    def name(self) -> str:
        """``replicated:<root>,<root>...``."""
        return "replicated:" + ",".join(s.name for s in self.stores)

    def home(self, key: BlockKey) -> int:
        """Index of the root a key is written to."""
        return int.from_bytes(key.raw[:8], "little") % len(self.stores)

    def _where(self, key: BlockKey) -> list[int]:
        with self._lock:
            return list(self._copies.get(key.raw, [self.home(key)]))

    def contains(self, key: BlockKey) -> bool:
        """True when any copy exists."""
        return any(self.stores[i].contains(key) for i in self._where(key))

    def put(self, header: BlockHeader, payload: np.ndarray | bytes) -> int:
        """Write to the key's home root."""
        return self.stores[self.home(header.key)].put(header, payload)

    def read_batch(self, ops: list[ReadOp], pool: BufferPool) -> None:
        """Read each op from one of its copies (rotating), falling back to the others."""
        by_root: dict[int, list[ReadOp]] = {}
        for op in ops:
            where = self._where(op.key)
            pick = where[next(self._rr) % len(where)]
            by_root.setdefault(pick, []).append(op)
        for index, group in by_root.items():
            self.stores[index].read_batch(group, pool)
            for op in group:
                if op.missing and op.error is None:
                    self._fallback(op, index, pool)
        for op in ops:
            if op.header is not None and op.buffer is not None:
                self._count(op, pool)

    def _fallback(self, op: ReadOp, tried: int, pool: BufferPool) -> None:
        for index in self._where(op.key) + [self.home(op.key)]:
            if index == tried:
                continue
            op.missing = False
            self.stores[index].read_batch([op], pool)
            if not op.missing:
                return

    def _count(self, op: ReadOp, pool: BufferPool) -> None:
        assert op.header is not None and op.buffer is not None
        with self._lock:
            count = self._counts.get(op.key.raw, 0) + 1
            self._counts[op.key.raw] = count
            replicate = (self.hot_reads > 0 and count == self.hot_reads
                         and len(self._copies.get(op.key.raw, [])) < self.replicas)
        if replicate:
            self._replicate(op.key, op.header, op.buffer.payload(op.header.payload_len))

    def _replicate(self, key: BlockKey, header: BlockHeader, payload: np.ndarray) -> None:
        home = self.home(key)
        copies = [home]
        for step in range(1, len(self.stores)):
            if len(copies) >= self.replicas:
                break
            index = (home + step) % len(self.stores)
            try:
                self.stores[index].put(header, payload)
            except StorageError:
                continue
            copies.append(index)
            self._registry.counter("dualpath_storage_replicated_blocks_total",
                                   root=self.stores[index].name).inc()
        with self._lock:
            self._copies[key.raw] = copies

    def delete(self, key: BlockKey) -> bool:
        """Delete every copy."""
        with self._lock:
            self._copies.pop(key.raw, None)
        return any([s.delete(key) for s in self.stores])

    def keys(self) -> Iterator[BlockKey]:
        """Distinct keys over all roots."""
        seen: set[bytes] = set()
        for store in self.stores:
            for key in store.keys():
                if key.raw not in seen:
                    seen.add(key.raw)
                    yield key

    def usage(self) -> StoreUsage:
        """Sum over roots (replicas count in bytes)."""
        parts = [s.usage() for s in self.stores]
        caps = [p.capacity_bytes for p in parts]
        cap = None if any(c is None for c in caps) else sum(c or 0 for c in caps)
        return StoreUsage(sum(p.blocks for p in parts), sum(p.bytes for p in parts), cap)

    def quarantine(self, key: BlockKey, reason: str) -> str | None:
        """Quarantine every copy."""
        moved = [s.quarantine(key, reason) for s in self.stores]
        return next((m for m in moved if m), None)

    def access_counts(self) -> dict[BlockKey, int]:
        """Reads per block through this store."""
        with self._lock:
            return {BlockKey(k): n for k, n in self._counts.items()}

    def copies(self, key: BlockKey) -> list[int]:
        """Root indices holding ``key`` (home first)."""
        return self._where(key)

    def hottest(self, n: int = 10) -> list[tuple[BlockKey, int]]:
        """The ``n`` most-read blocks."""
        counts = self.access_counts()
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].raw))[:n]

    def gc(self, capacity_bytes: int | None = None, purge_quarantine: bool = False) -> GcReport:
        """gc every root (``capacity_bytes`` applies per root)."""
        total = GcReport()
        for store in self.stores:
            r = store.gc(capacity_bytes, purge_quarantine)
            total.evicted_blocks += r.evicted_blocks
            total.evicted_bytes += r.evicted_bytes
            total.temp_files += r.temp_files
            total.quarantine_files += r.quarantine_files
        return total
