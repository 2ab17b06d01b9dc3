"""The DRAM buffer cache in front of a store: LRU by bytes, holding verified blocks.

Entries keep a reference to the read buffer itself (no copy), so a hit hands out another
reference to the very bytes the store wrote into; eviction only drops the cache's reference
and the buffer is reused once every caller has released it too.

Blocks put by a prefetch stay marked until a request's lookup first hits them, which is how
the loader measures prefetch accuracy (:attr:`BlockCache.prefetch_used`).

Blocks that left (evicted for capacity, or discarded as corrupt) are remembered in a bounded
record, so a later miss on them names its reason (:meth:`BlockCache.miss_reason`) instead of
looking like a block the buffer never held.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from dualpath_cli.core.layout import BlockKey
from dualpath_cli.storage.buffers import BlockBuffer
from dualpath_cli.storage.header import BlockHeader

__all__ = ["BlockCache", "GONE_RECORD"]

#: How many departed keys the cache remembers for miss reasons (about 2.5 MiB at most).
GONE_RECORD = 32_768


class BlockCache:
    """LRU of (header, buffer) by key, bounded by ``capacity_bytes`` (0 disables it)."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"cache capacity must be >= 0 bytes, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, tuple[BlockHeader, BlockBuffer]] = OrderedDict()
        self.bytes = 0
        self.evictions = 0
        self._unused_prefetch: set[bytes] = set()  # prefetched, not yet hit by a request
        self.prefetch_used = 0  # prefetched blocks a request's lookup later hit
        self._put_at: dict[bytes, float] = {}  # when each held block entered
        # departed keys: reason ("evicted", "quarantined") and age when they left
        self._gone: OrderedDict[bytes, tuple[str, float | None]] = OrderedDict()

    def _left(self, raw: bytes, reason: str, now: float) -> None:
        """Remember why ``raw`` left (lock held); the oldest records go first."""
        put = self._put_at.pop(raw, None)
        self._gone[raw] = (reason, None if put is None else now - put)
        self._gone.move_to_end(raw)
        if len(self._gone) > GONE_RECORD:
            self._gone.popitem(last=False)

    def miss_reason(self, key: BlockKey) -> tuple[str, float | None]:
        """Why a lookup of ``key`` missed: ``("evicted", age_s)`` (left for capacity after
        ``age_s`` seconds here), ``("quarantined", None)`` (discarded as corrupt) or
        ``("never_stored", None)`` (never held, or forgotten from the bounded record)."""
        with self._lock:
            gone = self._gone.get(key.raw)
        return gone if gone is not None else ("never_stored", None)

    def get(self, key: BlockKey, prefetch: bool = False) -> tuple[BlockHeader, BlockBuffer] | None:
        """A new reference to the cached block (caller releases it), or None.

        A hit from a request (``prefetch`` False) on a block a prefetch put here counts it,
        once, in :attr:`prefetch_used`; a prefetch's own lookup never does.
        """
        with self._lock:
            entry = self._entries.get(key.raw)
            if entry is None:
                return None
            self._entries.move_to_end(key.raw)
            if not prefetch and key.raw in self._unused_prefetch:
                self._unused_prefetch.discard(key.raw)
                self.prefetch_used += 1
            entry[1].retain()
            return entry

    def put(self, key: BlockKey, header: BlockHeader, buffer: BlockBuffer,
            prefetched: bool = False) -> bool:
        """Cache a block (takes its own reference); False when it cannot fit.

        ``prefetched`` marks a block read ahead that no request has used yet.
        """
        size = buffer.capacity
        if size > self.capacity_bytes:
            return False
        dropped: list[BlockBuffer] = []
        with self._lock:
            if key.raw in self._entries:
                self._entries.move_to_end(key.raw)
                return True
            now = time.monotonic()
            while self._entries and self.bytes + size > self.capacity_bytes:
                old_key, (_, old) = self._entries.popitem(last=False)
                self._unused_prefetch.discard(old_key)
                self.bytes -= old.capacity
                self.evictions += 1
                self._left(old_key, "evicted", now)
                dropped.append(old)
            self._entries[key.raw] = (header, buffer.retain())
            self._put_at[key.raw] = now
            self._gone.pop(key.raw, None)
            self.bytes += size
            if prefetched:
                self._unused_prefetch.add(key.raw)
        for old in dropped:
            old.release()
        return True

    def discard(self, key: BlockKey) -> None:
        """Drop a key (e.g. after the store quarantined it)."""
        with self._lock:
            entry = self._entries.pop(key.raw, None)
            self._unused_prefetch.discard(key.raw)
            self._left(key.raw, "quarantined", time.monotonic())
            if entry is not None:
                self.bytes -= entry[1].capacity
        if entry is not None:
            entry[1].release()

    def clear(self) -> None:
        """Drop everything."""
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
            self._unused_prefetch.clear()
            self._put_at.clear()
            self.bytes = 0
        for _, buf in entries:
            buf.release()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: BlockKey) -> bool:
        return key.raw in self._entries
