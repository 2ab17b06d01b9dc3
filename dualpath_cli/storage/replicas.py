"""Hot-block replicas across several store roots (the seed's hotspot mitigation).

Agentic workloads re-read the same system-prompt and tool-schema prefixes on every turn, so
a few blocks take most reads and the storage targets holding them saturate. A copy of such a
block on another root (another 3FS directory placed on other storage targets, another NFS
export) splits those reads. Two ways to use it:

* **Key-hashed homes, automatic replicas** (the library default): a block's home is chosen
  by its key (spread evenly over roots); a block read ``hot_reads`` times is copied to up to
  ``replicas`` roots in total.
* **One primary root plus replica roots** (``primary_home=True``, what a launched cluster
  runs with ``storage.replica_roots`` / ``launch --replica-root``): every block is written
  to root 0, which ``storage inspect/verify/gc`` keep working on; replica roots hold only
  copies of the blocks an operator (``dualpath diagnose long-tail --fix``, the API's
  ``POST /api/v1/store/replicate``) chose with :meth:`replicate`. The files are the truth:
  copies found on the replica roots at open, or later by a probe every
  :data:`PROBE_EVERY` reads of a block, are read from too. So every engine on every node
  that mounts the same roots discovers a copy made by any process, with no message between
  them, and a restarted engine finds them again.

Reads of a block with copies rotate among them, each copy's reads are counted
(:meth:`copy_reads`: the evidence that a hot spot cooled), and a copy that fails (missing,
unreadable, corrupt: its root quarantines it) is dropped and the read served by another
copy, so corrupt bytes are never returned. ``hottest()`` lists the access counts that find
hotspots.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator, Sequence

import numpy as np

from dualpath_cli.core.layout import BlockKey
from dualpath_cli.storage.buffers import BufferPool
from dualpath_cli.storage.errors import StorageError, StorageUsageError
from dualpath_cli.storage.header import BlockHeader
from dualpath_cli.storage.store import (
    GcReport,
    KVStore,
    ReadOp,
    StoreUsage,
    persists_access_counts,
    read_one,
    removal_generation,
)
from dualpath_cli.telemetry.registry import REGISTRY, MetricsRegistry

__all__ = ["ReplicatedStore", "PROBE_EVERY"]

#: A block's replica roots are probed for copies made elsewhere every this many reads of it
#: (a stat per replica root; cold blocks, read fewer times, are never probed).
PROBE_EVERY = 4
#: Blocks whose reads are counted at most; beyond it the least-read half is dropped (a hot
#: block, read far more often than the rest, always survives).
_COUNTS_TRACKED = 16384


class ReplicatedStore:
    """A KVStore over several roots with hot-block replicas.

    Args:
        stores: the roots (each a KVStore), at least one.
        hot_reads: reads after which a block gets replicas automatically (0: only on
            request, :meth:`replicate`).
        replicas: copies of a hot block in total, home included (capped at len(stores)).
        primary_home: every block's home is root 0 (the others hold copies only), and
            copies on the other roots are discovered from the files (at open and by probing).
    """

    def __init__(self, stores: Sequence[KVStore], hot_reads: int = 8, replicas: int = 2,
                 registry: MetricsRegistry = REGISTRY, *, primary_home: bool = False) -> None:
        if not stores:
            raise StorageUsageError("a replicated store needs at least one root")
        self.stores = list(stores)
        self.hot_reads = hot_reads
        self.replicas = max(1, min(replicas, len(self.stores)))
        self.primary_home = primary_home
        self._lock = threading.Lock()
        self._counts: dict[bytes, int] = {}
        self._copies: dict[bytes, list[int]] = {}
        self._copy_reads: dict[bytes, list[int]] = {}  # key -> reads per root index
        self._turn: dict[bytes, int] = {}  # key -> reads rotated over its copies
        self._dropped = 0  # copies this store stopped consulting (part of its removals)
        self._registry = registry
        if primary_home:
            for index in range(1, len(self.stores)):  # replica roots hold copies only
                for key in self.stores[index].keys():
                    self._copies.setdefault(key.raw, [0]).append(index)

    @property
    def name(self) -> str:
        """``replicated:<root>,<root>...``."""
        return "replicated:" + ",".join(s.name for s in self.stores)

    def home(self, key: BlockKey) -> int:
        """Index of the root a key is written to."""
        if self.primary_home:
            return 0
        return int.from_bytes(key.raw[:8], "little") % len(self.stores)

    def _where(self, key: BlockKey) -> list[int]:
        with self._lock:
            return list(self._copies.get(key.raw, [self.home(key)]))

    def contains(self, key: BlockKey) -> bool:
        """True when any copy exists."""
        return any(self.stores[i].contains(key) for i in self._where(key))

    def removals(self) -> tuple[Hashable, ...] | None:
        """The removal generation (:class:`~dualpath_cli.storage.store.CountsRemovals`):
        every root's and the copies this store dropped; ``None`` when a root's is unknown."""
        with self._lock:
            dropped = self._dropped
        parts = [removal_generation(s) for s in self.stores]
        return None if any(p is None for p in parts) else (dropped, *parts)

    def put(self, header: BlockHeader, payload: np.ndarray | bytes) -> int:
        """Write to the key's home root."""
        return self.stores[self.home(header.key)].put(header, payload)

    def read_batch(self, ops: list[ReadOp], pool: BufferPool) -> None:
        """Read each op from one of its copies (rotating), falling back to the others."""
        by_root: dict[int, list[ReadOp]] = {}
        with self._lock:  # each block rotates over its own copies (a shared counter aliases)
            for op in ops:
                where = self._copies.get(op.key.raw)
                if where is None:
                    pick = self.home(op.key)
                else:
                    turn = self._turn.get(op.key.raw, 0)
                    self._turn[op.key.raw] = turn + 1
                    pick = where[turn % len(where)]
                by_root.setdefault(pick, []).append(op)
        served: dict[int, int] = {}  # id(op) -> root that served it
        for index, group in by_root.items():
            self.stores[index].read_batch(group, pool)
            for op in group:
                if op.ok:
                    served[id(op)] = index
                elif len(self._where(op.key)) > 1 or index != self.home(op.key):
                    served[id(op)] = self._fallback(op, index, pool)
        for op in ops:
            if op.ok and not op.probe:
                self._count(op, served.get(id(op), -1), pool)

    def _fallback(self, op: ReadOp, tried: int, pool: BufferPool) -> int:
        """Serve ``op`` from another copy after copy ``tried`` failed (missing, unreadable
        or corrupt: that root quarantined it); each failed copy is no longer read. Returns
        the root that served it (-1: none did).

        Each other copy is tried once. When none serves the block, the op carries the worst
        failure seen: a corrupt copy's error before an I/O error before "missing" (a copy
        quarantined by an earlier try reads as missing; reporting that would hide the
        corruption from every surface that counts corrupt blocks). When one does, the corrupt
        copies found on the way are on ``op.copy_errors``, so the block counts as found
        corrupt all the same."""
        self._drop_copy(op.key, tried)
        corrupt = [op.error] if op.error is not None else []
        io_error = op.io_error
        for index in dict.fromkeys([*self._where(op.key), self.home(op.key)]):
            if index == tried:
                continue
            if op.buffer is not None:
                op.buffer.release()
            op.buffer = op.header = op.error = op.io_error = None
            op.missing = False
            self.stores[index].read_batch([op], pool)
            if op.ok:
                op.copy_errors = tuple(corrupt)
                return index
            if op.error is not None:
                corrupt.append(op.error)
            io_error = io_error or op.io_error
            self._drop_copy(op.key, index)
        if corrupt:  # the worst failure: a corrupt copy (quarantined), not a later "missing"
            op.missing, op.io_error, op.error = False, None, corrupt[0]
        elif io_error is not None:
            op.missing, op.io_error = True, io_error
        return -1

    def _drop_copy(self, key: BlockKey, index: int) -> None:
        with self._lock:
            copies = self._copies.get(key.raw)
            if copies is not None and index in copies and index != self.home(key):
                copies.remove(index)
                self._dropped += 1

    def _count(self, op: ReadOp, root: int, pool: BufferPool) -> None:
        assert op.header is not None and op.buffer is not None
        raw = op.key.raw
        with self._lock:
            count = self._counts.get(raw, 0) + 1
            self._counts[raw] = count
            if len(self._counts) > _COUNTS_TRACKED:
                keep = sorted(self._counts.items(), key=lambda kv: -kv[1])
                self._counts = dict(keep[:_COUNTS_TRACKED // 2])
            per_root = self._copy_reads.get(raw)
            if per_root is None and raw in self._copies:
                per_root = self._copy_reads[raw] = [0] * len(self.stores)
            if per_root is not None and root >= 0:
                per_root[root] += 1
            replicate = (self.hot_reads > 0 and count == self.hot_reads
                         and len(self._copies.get(raw, [])) < self.replicas)
            probe = self.primary_home and count % PROBE_EVERY == 0
        if replicate:
            self._replicate(op.key, op.header, op.buffer.payload(op.header.payload_len))
        elif probe:
            self._probe(op.key)

    def _probe(self, key: BlockKey) -> None:
        """Add copies of ``key`` another process made on the replica roots."""
        known = set(self._where(key))
        found = [i for i in range(len(self.stores))
                 if i not in known and self.stores[i].contains(key)]
        if found:
            with self._lock:
                copies = self._copies.setdefault(key.raw, [self.home(key)])
                copies.extend(i for i in found if i not in copies)

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

    def replicate(self, key: BlockKey, copies: int) -> tuple[list[int], list[int]]:
        """Give ``key`` up to ``copies`` copies in total (home included), on the roots after
        its home; each new copy is read back and verified (header and payload checksums)
        before it counts.

        Returns:
            (root indices holding a verified copy, home first; those added now).

        Raises:
            StorageError: the home copy is missing or corrupt (nothing to copy from), or a
                root refused the write.
        """
        home = self.home(key)
        source = read_one(self.stores[home], key)  # raises when corrupt (quarantined)
        if source is None:
            raise StorageError(f"block {key.hex} is not in {self.stores[home].name}")
        added: list[int] = []
        try:
            have = [home] + [i for i in range(len(self.stores))
                             if i != home and self.stores[i].contains(key)]
            for step in range(1, len(self.stores)):
                index = (home + step) % len(self.stores)
                if len(have) >= copies:
                    break
                if index in have:
                    continue
                self.stores[index].put(source.header, source.payload)
                check = read_one(self.stores[index], key)  # verified, else raises
                if check is None:
                    raise StorageError(f"block {key.hex}: the copy on "
                                       f"{self.stores[index].name} vanished after writing")
                check.release()
                have.append(index)
                added.append(index)
                self._registry.counter("dualpath_storage_replicated_blocks_total",
                                       root=self.stores[index].name).inc()
        finally:
            source.release()
        with self._lock:
            self._copies[key.raw] = sorted(have, key=lambda i: (i != home, i))
        return self._where(key), added

    def delete(self, key: BlockKey) -> bool:
        """Delete every copy."""
        with self._lock:
            self._copies.pop(key.raw, None)
            self._copy_reads.pop(key.raw, None)
            self._turn.pop(key.raw, None)
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

    def flush_access_counts(self) -> None:
        """Persist each root's read counts (the roots that keep them on disk)."""
        for store in self.stores:
            if persists_access_counts(store):
                store.flush_access_counts()

    def copies(self, key: BlockKey) -> list[int]:
        """Root indices holding ``key`` (home first)."""
        return self._where(key)

    def copy_reads(self, key: BlockKey) -> dict[str, int]:
        """Reads of ``key`` served by each root holding a copy (root name -> reads), counted
        from when this store first knew of a second copy; empty for a block with one copy."""
        with self._lock:
            per_root = self._copy_reads.get(key.raw)
            copies = list(self._copies.get(key.raw, ()))
            if per_root is None or len(copies) < 2:
                return {}
            return {self.stores[i].name: per_root[i] for i in copies}

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
