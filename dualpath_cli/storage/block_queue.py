"""A loader's queue of block reads: prioritised, deduplicated by key, sized in blocks, bytes
and tokens (the node's read_q), and cut into the batches its reader threads take.

Not thread-safe by itself: the loader calls every method with its lock held.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from dualpath_cli.core.layout import BlockKey
from dualpath_cli.storage.tickets import LoadTicket, ReadQueue

__all__ = ["BlockQueue", "PendingRead"]

_LOOKAHEAD_BYTES = 8 << 20  # how far a pipelined reader's batch runs ahead of its share
_LOOKAHEAD_BLOCKS = 64
# a reader that reads one block at a time (preadv) takes at most about this much per batch:
# a batch's buffers are held until the whole batch completes, and a long batch of large
# blocks keeps a working set of buffers bigger than the CPU caches (every block read into a
# cold buffer costs a fetch and a write-back of its lines)
_SYNC_BATCH_BYTES = 8 << 20


@dataclass(eq=False, slots=True)
class PendingRead:
    """One block's read, queued or in flight, and the tickets waiting for it."""

    key: BlockKey
    nbytes: int
    tokens: int
    priority: int
    submitted: float
    waiters: list[tuple[LoadTicket, int]] = field(default_factory=list)
    prefetch: bool = False
    started: bool = False
    dropped: bool = False
    counted: bool = False  # counted in reads in flight (a pipelined batch's head)


class BlockQueue:
    """The reads a loader has queued or in flight (see the module doc; lock held).

    Args:
        workers: the loader's reader threads, which share the queue.
        max_share: reads one reader keeps in flight at most.
        batch_bytes: a reader takes at least this much work per wake-up.
        est_bytes: expected bytes per block (0: learnt from the first block read).
        pipelined: the store bounds its own reads in flight (a batch may run ahead).
        overlap: each reader overlaps its checksums with its next batch's reads.
    """

    def __init__(self, *, workers: int, max_share: int, batch_bytes: int, est_bytes: int,
                 pipelined: bool, overlap: bool) -> None:
        self.workers = workers
        self.max_share = max_share
        self.batch_bytes = batch_bytes
        self.est_bytes = est_bytes
        self._pipelined = pipelined
        self._overlap = overlap
        self._heap: list[tuple[int, int, PendingRead]] = []
        self._seq = itertools.count()
        self._pending: dict[bytes, PendingRead] = {}
        self.blocks = self.bytes = self.tokens = self.in_flight = 0

    @property
    def waiting(self) -> bool:
        """True while some queued entry may still be taken."""
        return bool(self._heap)

    def size(self) -> ReadQueue:
        """Blocks, bytes and tokens queued or in flight."""
        return ReadQueue(self.blocks, self.bytes, self.tokens, self.in_flight)

    def add(self, key: BlockKey, nbytes: int, tokens: int, priority: int, now: float,
            prefetch: bool) -> tuple[PendingRead, bool]:
        """The read of ``key``, queued now unless it already is (True when it was queued
        now); a queued read not yet started moves up to a better ``priority``."""
        pending = self._pending.get(key.raw)
        if pending is None:
            pending = PendingRead(key, nbytes, tokens, priority, now, prefetch=prefetch)
            self._pending[key.raw] = pending
            heapq.heappush(self._heap, (priority, next(self._seq), pending))
            self.blocks += 1
            self.bytes += nbytes
            self.tokens += tokens
            return pending, True
        if priority < pending.priority and not pending.started:
            pending.priority = priority  # re-push at the better priority
            heapq.heappush(self._heap, (priority, next(self._seq), pending))
        return pending, False

    def leave(self, key: BlockKey, ticket: LoadTicket) -> int:
        """``ticket`` no longer waits for ``key``; its read is dropped (1 returned) when no
        one else waits, it is no prefetch and it has not started."""
        pending = self._pending.get(key.raw)
        if pending is None:
            return 0
        pending.waiters = [w for w in pending.waiters if w[0] is not ticket]
        if pending.waiters or pending.prefetch or pending.started:
            return 0
        pending.dropped = True
        del self._pending[key.raw]
        self.blocks -= 1
        self.bytes -= pending.nbytes
        self.tokens -= pending.tokens
        return 1

    def done(self, pending: PendingRead) -> None:
        """``pending``'s read returned (delivered or missed): out of the queue."""
        self._pending.pop(pending.key.raw, None)
        if pending.counted:
            self.in_flight -= 1
        self.blocks -= 1
        self.bytes -= pending.nbytes
        self.tokens -= pending.tokens

    def drain(self) -> list[PendingRead]:
        """Empty the queue; returns the reads that never started (the loader is closing)."""
        leftovers = [p for _, _, p in self._heap if not p.started and not p.dropped]
        self._heap.clear()
        return leftovers

    def min_share(self) -> int:
        """Blocks worth one wake-up: enough to cover ``batch_bytes``."""
        if not self.est_bytes:
            return 1
        return max(1, min(self.max_share, -(-self.batch_bytes // self.est_bytes)))

    def _lookahead(self) -> int:
        """Blocks a pipelined reader takes beyond its share: about 8 MiB."""
        est = self.est_bytes or (1 << 20)
        return max(self.max_share, min(_LOOKAHEAD_BLOCKS, -(-_LOOKAHEAD_BYTES // est)))

    def take(self, count: bool = True) -> list[PendingRead]:
        """Pop one reader's share of the queue; with ``count`` its first ``max_share``
        reads count as in flight at once.

        With a pipelining store the batch may exceed the share by a lookahead; the store keeps
        only the share in flight, and only those count as reads in flight here. A reader that
        reads one block at a time takes no more than about ``_SYNC_BATCH_BYTES`` (and at
        least ``batch_bytes``), so buffers return to the pool while still cache-hot.
        """
        fair = -(-self.blocks // self.workers)
        least = self.min_share()
        if self._pipelined:
            share = min(self.max_share + self._lookahead(), max(least, fair))
        else:
            est = self.est_bytes or (1 << 20)
            sync_cap = max(least, -(-_SYNC_BATCH_BYTES // est))
            # a lone reader (or one overlapping its checksums) reads its batch one block at a
            # time whatever its length, so it may take more than its share: fewer hand-offs,
            # reads in flight unchanged, and no other reader it could starve
            alone = self._overlap or self.workers == 1
            cap = max(self.max_share, sync_cap) if alone else self.max_share
            share = min(cap, max(least, min(fair, sync_cap)))
        batch: list[PendingRead] = []
        while self._heap and len(batch) < share:
            _, _, pending = heapq.heappop(self._heap)
            if pending.started or pending.dropped:
                continue
            pending.started = True
            batch.append(pending)
        if count:
            self.count(batch)
        return batch

    def count(self, batch: list[PendingRead]) -> None:
        """The batch's first ``max_share`` reads are now the ones in flight."""
        for pending in batch[:self.max_share]:
            if not pending.counted:
                pending.counted = True
                self.in_flight += 1

    def retire(self, batch: list[PendingRead]) -> None:
        """The batch's reads have returned: no longer reads in flight."""
        for pending in batch:
            if pending.counted:
                pending.counted = False
                self.in_flight -= 1
