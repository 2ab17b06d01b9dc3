"""Page-aligned, reusable read buffers (the PE/DE buffer in host DRAM).

Reads land directly in these buffers (``preadv`` or io_uring into two aligned iovecs), and
decoded raw blocks are views of them, so a block crosses the storage NIC into DRAM once and
is never copied again. Buffers are reference-counted leases: the loader's DRAM cache and
every caller holding a block keep a reference, and the buffer returns to its pool for reuse
when the last one releases it. Allocation is mmap, so buffers are page-aligned (O_DIRECT).

Buffers of 256 KiB and more are carved, eight at a time, out of 2 MiB-aligned slabs advised
for transparent huge pages. Why: an O_DIRECT read is handed to the device as one segment per
physically contiguous run of its buffer, and a virtio disk takes at most 254 segments per
request; a 1 MiB read into 4 KiB pages is 256 segments, so it went out as two requests, and
at about 4 ms per request on the bench VM that halved the loader's O_DIRECT rate (1.4-1.5
GB/s at 1 MiB, QD 8, 760 KiB per request; from huge-page slabs 3.1-3.3 GB/s, one 1028 KiB
request per block). Where huge pages are off the slabs are plain memory and nothing changes.
"""

from __future__ import annotations

import mmap
import threading
from collections import defaultdict

import numpy as np

from dualpath_cli.storage.header import HEADER_SIZE, padded

__all__ = ["BlockBuffer", "BufferPool"]

_HUGE_PAGE = 2 << 20
_SLAB_MIN_BUFFER = 256 << 10  # smaller buffers get a mapping each
_SLAB_BUFFERS = 8  # buffers carved from one slab


class _Slab:
    """A 2 MiB-aligned private mapping advised for huge pages, carved into equal buffers."""

    __slots__ = ("map", "next", "end", "size")

    def __init__(self, size: int, count: int) -> None:
        nbytes = -(-size * count // _HUGE_PAGE) * _HUGE_PAGE
        self.map = mmap.mmap(-1, nbytes + _HUGE_PAGE,
                             flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        addr = int(np.frombuffer(self.map, dtype=np.uint8, count=1).ctypes.data)
        start = (-addr) % _HUGE_PAGE  # a multiple of the page size: a valid madvise offset
        advice = getattr(mmap, "MADV_HUGEPAGE", None)  # Linux only
        if advice is not None:
            try:
                self.map.madvise(advice, start, nbytes)
            except OSError:  # huge pages unsupported here: plain pages, same layout
                pass
        self.next, self.end, self.size = start, start + nbytes, size

    def take(self) -> int | None:
        """Offset of the next free buffer in the mapping, or None when the slab is used up."""
        if self.next + self.size > self.end:
            return None
        offset = self.next
        self.next += self.size
        return offset


class BlockBuffer:
    """One aligned buffer big enough for a whole block file (header + padded payload)."""

    __slots__ = ("_map", "_offset", "_carved", "data", "capacity", "_refs", "_lock", "_pool",
                 "_header", "_body", "iov", "addr")

    def __init__(self, nbytes: int, pool: BufferPool | None = None,
                 region: tuple[mmap.mmap, int] | None = None) -> None:
        self.capacity = padded(max(nbytes, HEADER_SIZE))
        # a mapping of its own, or ``capacity`` bytes at an offset of a pool's slab (the
        # slab's mapping lives as long as any buffer carved from it)
        self._map, offset = region if region is not None else (mmap.mmap(-1, self.capacity), 0)
        self._offset, self._carved = offset, region is not None
        self.data = np.frombuffer(self._map, dtype=np.uint8, count=self.capacity, offset=offset)
        # iovec targets made once: slicing a memoryview is several times cheaper than
        # slicing the array and asking for its ``.data`` on every read
        whole = memoryview(self._map)[offset:offset + self.capacity]
        self._header = whole[:HEADER_SIZE]
        self._body = whole[HEADER_SIZE:]
        # the whole buffer as (header, payload) iovecs: a page-cache read asks for as much as
        # fits, so one preadv returns the whole file without an fstat to size it first
        self.iov = [self._header, self._body]
        self.addr: int = self.data.ctypes.data  # for the native read path (storage.native)
        self._refs = 1
        self._lock = threading.Lock()
        self._pool = pool

    @property
    def header(self) -> memoryview:
        """The header region, as a writable memoryview (an iovec target)."""
        return self._header

    def payload(self, nbytes: int) -> np.ndarray:
        """The first ``nbytes`` of the payload region (a view)."""
        return self.data[HEADER_SIZE:HEADER_SIZE + nbytes]

    def payload_view(self, nbytes: int) -> memoryview:
        """The first ``nbytes`` of the payload region as a memoryview (cheaper than
        :meth:`payload` where only the bytes matter, e.g. checksums)."""
        return self._body[:nbytes]

    def payload_iov(self, file_size: int) -> memoryview:
        """The payload region covering a file of ``file_size`` bytes, aligned (iovec target)."""
        end = min(self.capacity, padded(max(file_size, HEADER_SIZE)))
        return self._body[:max(end, HEADER_SIZE) - HEADER_SIZE]

    def retain(self) -> BlockBuffer:
        """Add a reference (the cache and a caller may both hold the buffer)."""
        with self._lock:
            if self._refs <= 0:
                raise RuntimeError("retain() on a released buffer")
            self._refs += 1
        return self

    def release(self) -> None:
        """Drop a reference; the last one returns the buffer to its pool."""
        with self._lock:
            self._refs -= 1
            last = self._refs == 0
            if self._refs < 0:
                raise RuntimeError("buffer released more times than retained")
        if last and self._pool is not None:
            self._pool.give_back(self)

    def reissue(self) -> None:
        """Lend a released buffer out again (its pool reuses it): one reference."""
        self._refs = 1

    def detach(self) -> None:
        """Leave the pool for good (it keeps no more free buffers); a buffer carved from a
        slab hands its pages back now (they read as zeros if touched again), so a slab
        shared with buffers kept for reuse does not hold dropped memory. A buffer with a
        mapping of its own frees it with the object."""
        self._pool = None
        if self._carved:
            try:
                self._map.madvise(mmap.MADV_DONTNEED, self._offset, self.capacity)
            except (AttributeError, OSError):  # no madvise here: the pages stay until the slab goes
                pass

    @property
    def refs(self) -> int:
        """Current reference count (for tests and inspection)."""
        return self._refs


class BufferPool:
    """Free lists of :class:`BlockBuffer` by size class; bounded by ``max_free_bytes``.

    Args:
        max_free_bytes: free buffers kept for reuse beyond this are unmapped (default 1 GiB).
    """

    def __init__(self, max_free_bytes: int = 1 << 30) -> None:
        self.max_free_bytes = max_free_bytes
        self._lock = threading.Lock()
        self._free: dict[int, list[BlockBuffer]] = defaultdict(list)
        self._free_bytes = 0
        self._slabs: dict[int, _Slab] = {}  # the slab being carved, per size class
        self.allocated = 0  # buffers ever created (reuse shows as a flat count)

    def acquire(self, file_size: int) -> BlockBuffer:
        """A buffer for a block file of ``file_size`` bytes, reused when one is free."""
        size = padded(max(file_size, HEADER_SIZE))
        with self._lock:
            free = self._free.get(size)
            if free:
                buf = free.pop()
                self._free_bytes -= size
                buf.reissue()
                return buf
            self.allocated += 1
            region = self._carve(size) if size >= _SLAB_MIN_BUFFER else None
        return BlockBuffer(size, self, region)

    def _carve(self, size: int) -> tuple[mmap.mmap, int]:
        """A new buffer's place in this size class's slab (lock held)."""
        slab = self._slabs.get(size)
        offset = slab.take() if slab is not None else None
        if slab is None or offset is None:
            slab = self._slabs[size] = _Slab(size, _SLAB_BUFFERS)
            offset = slab.take()
        assert offset is not None
        return slab.map, offset

    def give_back(self, buf: BlockBuffer) -> None:
        """Take back a buffer its last holder released (:meth:`BlockBuffer.release`): kept
        for reuse while the free lists have room, else dropped."""
        with self._lock:
            if self._free_bytes + buf.capacity <= self.max_free_bytes:
                self._free[buf.capacity].append(buf)
                self._free_bytes += buf.capacity
                return
        buf.detach()

    @property
    def free_bytes(self) -> int:
        """Bytes held in free lists."""
        return self._free_bytes
