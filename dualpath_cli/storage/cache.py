"""The DRAM buffer cache in front of a store: LRU by bytes, holding verified blocks.

Entries keep a reference to the read buffer itself (no copy), so a hit hands out another
reference to the very bytes the store wrote into; eviction only drops the cache's reference
and the buffer is reused once every caller has released it too.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from dualpath_cli.core.layout import BlockKey
from dualpath_cli.storage.buffers import BlockBuffer
from dualpath_cli.storage.header import BlockHeader

__all__ = ["BlockCache"]


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

    def get(self, key: BlockKey) -> tuple[BlockHeader, BlockBuffer] | None:
        """A new reference to the cached block (caller releases it), or None."""
        with self._lock:
            entry = self._entries.get(key.raw)
            if entry is None:
                return None
            self._entries.move_to_end(key.raw)
            entry[1].retain()
            return entry

    def put(self, key: BlockKey, header: BlockHeader, buffer: BlockBuffer) -> bool:
        """Cache a block (takes its own reference); False when it cannot fit."""
        size = buffer.capacity
        if size > self.capacity_bytes:
            return False
        dropped: list[BlockBuffer] = []
        with self._lock:
            if key.raw in self._entries:
                self._entries.move_to_end(key.raw)
                return True
            while self._entries and self.bytes + size > self.capacity_bytes:
                _, (_, old) = self._entries.popitem(last=False)
                self.bytes -= old.capacity
                self.evictions += 1
                dropped.append(old)
            self._entries[key.raw] = (header, buffer.retain())
            self.bytes += size
        for old in dropped:
            old.release()
        return True

    def discard(self, key: BlockKey) -> None:
        """Drop a key (e.g. after the store quarantined it)."""
        with self._lock:
            entry = self._entries.pop(key.raw, None)
            if entry is not None:
                self.bytes -= entry[1].capacity
        if entry is not None:
            entry[1].release()

    def clear(self) -> None:
        """Drop everything."""
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
            self.bytes = 0
        for _, buf in entries:
            buf.release()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: BlockKey) -> bool:
        return key.raw in self._entries
