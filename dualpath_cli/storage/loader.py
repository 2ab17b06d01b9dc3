"""The per-node StorageLoader: a queued, prioritised, bandwidth-shaped block reader.

It is the node's storage-NIC model and its PE/DE buffer. Requests enter a priority queue
measured in blocks, bytes and tokens (``read_queue.tokens`` is the paper's read_q that the
scheduler compares with alpha); a fixed set of reader threads keeps at most ``max_inflight``
reads in flight through the store's batched engine; a token bucket paces delivery to the
emulated NIC bandwidth; verified blocks land in a DRAM cache (LRU by bytes) that serves later
hits without touching the store. Prefetch accuracy is the share of blocks read ahead that a
later request used: it hit them in the cache, or joined their read while still in flight.

The reader loop is chosen by what the store's read path declares it can do
(:mod:`~dualpath_cli.storage.store`: ``isinstance`` on its capability protocols): a
:class:`BoundedReads` path (io_uring) gets batches longer than the reads it keeps in flight;
with a core to spare (fewer readers than cores: queue depth 1 on two cores) a
:class:`PipelinedReads` path keeps a reader's batches on the native read pipeline, C threads
that read and hash while the reader judges the batch before in Python, and a
:class:`SplitReads` path (without the native library) hands its checksums to a helper
thread while the reader reads the next batch. Any other store is read with its plain
``read_batch``.

Hand-offs are batched because a thread wake-up costs 25-40 us: a submission wakes at most
as many readers as it has batches of work, each reader takes a share of the queue per wake
and records metrics once per batch, and a ticket's waiter is woken once, when its last
block completes. DRAM-cache hits complete in the caller's thread with no hand-off at all.

A corrupt block is quarantined by the store and reported here as a miss (the engine
recomputes it); nothing corrupt is ever handed out. A block read found corrupt counts once
in ``dualpath_storage_corrupt_blocks_total``, also where a replicated store found a corrupt
copy on its way to a good one that served the read.

The queue of reads is :mod:`~dualpath_cli.storage.block_queue`, the metrics
:mod:`~dualpath_cli.storage.loader_metrics`, and what a load hands back (ticket, result,
miss reasons) :mod:`~dualpath_cli.storage.tickets`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dualpath_cli.core.layout import BlockKey
from dualpath_cli.storage.block import LoadedBlock
from dualpath_cli.storage.block_queue import BlockQueue, PendingRead
from dualpath_cli.storage.buffers import BufferPool
from dualpath_cli.storage.cache import BlockCache
from dualpath_cli.storage.engines import ChecksumHelper
from dualpath_cli.storage.loader_metrics import LoaderMetrics
from dualpath_cli.storage.shaper import TokenBucket
from dualpath_cli.storage.store import (
    BoundedReads,
    Deferred,
    KVStore,
    PipedBatch,
    PipelinedReads,
    ReadOp,
    SplitReads,
    persists_access_counts,
    read_path_of,
)
from dualpath_cli.storage.tickets import LoadResult, LoadTicket, ReadQueue, miss_reason_of
from dualpath_cli.telemetry.registry import REGISTRY, MetricsRegistry

if TYPE_CHECKING:  # types of the pipelined read capability
    from dualpath_cli.storage.native import NativePipeline

__all__ = ["StorageLoader", "PREFETCH_PRIORITY", "ReadHook"]

log = logging.getLogger(__name__)

PREFETCH_PRIORITY = 1 << 30  # below every request (lower numbers are served first)

#: Sees each batch's finished read ops before they are paced and delivered, and may change
#: them (fail a read) or delay them; returns the time the reads count as finished from
#: (fault injection: slow or failing reads, :mod:`dualpath_cli.runtime.faults`).
ReadHook = Callable[[list[ReadOp], float], float]
# batches a reader keeps queued on a native pipeline: one being read while the one before is
# hashed and judged (measured at QD 1, 1 MiB, loader medians over 12 runs: 2 x 8 MiB 24.8
# GB/s, 3 x 8 MiB 22.3, 4 x 4 MiB 21.9, 3 x 4 MiB 24.3; more queued means more buffers
# rotating through the caches)
_PIPE_DEPTH = 2


@dataclass(eq=False, slots=True)
class _Started:
    """A batch whose reads returned; checksums may still be running on the helper."""

    batch: list[PendingRead]
    ops: list[ReadOp]
    time: float
    deferred: list[Deferred] = field(default_factory=list)
    error: Exception | None = None


class StorageLoader:
    """Reads Full Blocks from a store for one node.

    Args:
        store: the KVStore to read.
        node: node id (metric label).
        role: engine role of the node (``prefill``/``decode``; metric label).
        shaping_bps: emulated storage-NIC bandwidth in bytes/s; None or 0 = unshaped.
        shaper: a token bucket to pace reads with instead of a private one built from
            ``shaping_bps`` (engines of one node share their node's storage NIC this way).
        max_inflight: store reads in flight at most (the queue depth).
        workers: reader threads (default: one per CPU; two per CPU for O_DIRECT preadv,
            which waits on the device); each hands at most ``max_inflight // workers`` reads
            to the engine.
        cache_bytes: DRAM buffer cache size (0 disables it, and prefetch with it).
        block_tokens: tokens per block, for the read queue in tokens.
        block_nbytes: expected bytes per block file, for the read queue in bytes before a
            block is read (the size of the first block read is used when 0).
        batch_bytes: a reader takes at least this much work per wake-up, so small reads are
            grouped instead of costing one thread wake-up each (default 1 MiB).
        burst_bytes: credit an idle emulated NIC may spend at once (default 0).
        pool: buffer pool for reads (default: a private one keeping up to 1 GiB, or 4x the
            cache, of free buffers mapped for reuse).
        registry: metrics registry (default: the process-wide one).
        clock, sleep: injectable time source (tests use a fake clock; no real sleeps).
    """

    def __init__(self, store: KVStore, *, node: int | str = 0, role: str = "prefill",
                 shaping_bps: float | None = None, shaper: TokenBucket | None = None,
                 max_inflight: int = 8,
                 workers: int | None = None, cache_bytes: int = 0, block_tokens: int = 64,
                 block_nbytes: int = 0, batch_bytes: int = 1 << 20, burst_bytes: int = 0,
                 pool: BufferPool | None = None, registry: MetricsRegistry = REGISTRY,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {max_inflight}")
        self.store = store
        self.node, self.role = str(node), role
        self.max_inflight = max_inflight
        # the store's read path and what it can do, by type: only a store whose own type
        # hands out a read path (a wrapper delegating by __getattr__ keeps its own read_batch)
        path = read_path_of(store)
        self.engine = path.engine if path is not None else "preadv"
        cpus = os.cpu_count() or 1
        if workers is None:
            # io_uring keeps many reads in flight per thread: one per core. preadv from the
            # page cache is a CPU-bound copy: one per core too (more threads only contend for
            # the GIL and the caches; measured 8-12% slower with two per core). preadv that
            # waits on a device (O_DIRECT without io_uring) overlaps waits: two per core.
            waits = path is not None and path.waits
            workers = min(max_inflight, max(2, 2 * cpus) if waits else cpus)
        self.workers = max(1, min(workers, max_inflight))
        # a reader keeps at most its share in flight, so workers x share bounds the reads in
        # flight (preadv reads one at a time; io_uring keeps up to a share in the ring)
        self.max_share = max(1, max_inflight // self.workers)
        # a path that bounds its reads in flight (io_uring) gets a longer batch than the
        # share: the ring stays full while completed blocks are verified, instead of
        # draining at every hand-off
        self._bounded = path if isinstance(path, BoundedReads) else None
        self._pipelined = self._bounded is not None
        # page-cache reads are a CPU copy and so is the payload checksum. With a core to
        # spare (fewer readers than cores), each reader keeps its batches on the native
        # read pipeline, or hands its checksums to a helper thread and reads the next batch
        # while the helper hashes the last one; a block is still delivered only after its
        # digest matched.
        spare = self._bounded is None and cpus >= 2 * self.workers
        self._split = path if spare and isinstance(path, SplitReads) else None
        self._piped = path if spare and isinstance(path, PipelinedReads) else None
        self._overlap = self._split is not None or self._piped is not None
        self.batch_bytes = batch_bytes
        self.block_tokens = block_tokens
        self.shaper = shaper or TokenBucket(shaping_bps, burst_bytes, clock, sleep)
        shaping_bps = self.shaper.rate
        self.cache = BlockCache(cache_bytes)
        # free buffers kept for reuse: a fresh mmap buffer costs a page fault and a zeroing
        # pass per 4 KiB page, more than the read itself, so keep the working set mapped
        self.pool = pool or BufferPool(max(1 << 30, 4 * cache_bytes))
        self.clock = clock
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._queue = BlockQueue(workers=self.workers, max_share=self.max_share,
                                 batch_bytes=batch_bytes, est_bytes=block_nbytes,
                                 pipelined=self._pipelined, overlap=self._overlap)
        self._idle = 0
        self._closed = False
        self._read_hook: ReadHook | None = None
        #: the last store read (or probe): when, and a block it read (storage/probe.py)
        self.last_store_read: tuple[float, BlockKey] | None = None
        self.registry = registry
        self.metrics = LoaderMetrics(registry, self.node, role, shaping_bps or 0.0, clock())
        self._threads = [threading.Thread(target=self._run, name=f"dp-loader-{node}-{i}",
                                          daemon=True) for i in range(self.workers)]
        for t in self._threads:
            t.start()

    @property
    def overlaps_checksums(self) -> bool:
        """True when each reader hashes on a helper thread while reading its next batch."""
        return self._overlap

    # --- public API -------------------------------------------------------------------------
    def set_read_hook(self, hook: ReadHook | None) -> None:
        """Put ``hook`` between every read path and delivery (None: none). Every read path
        ends in delivery, so the reader threads themselves stall or fail under the hook."""
        self._read_hook = hook

    @property
    def read_hook(self) -> ReadHook | None:
        """The hook between the read paths and delivery (None: none)."""
        return self._read_hook

    @property
    def read_queue(self) -> ReadQueue:
        """Blocks, bytes and tokens queued or in flight (the node's read_q)."""
        with self._lock:
            return self._queue.size()

    def submit(self, keys: Sequence[BlockKey], priority: int = 0,
               block_tokens: int | None = None, block_nbytes: int | None = None) -> LoadTicket:
        """Queue reads of ``keys`` (lower ``priority`` is served first); returns a ticket."""
        ticket = LoadTicket(list(keys), self._lock, self._cancel)
        self._enqueue(ticket, ticket.result.keys, priority, block_tokens, block_nbytes, False)
        return ticket

    def load(self, keys: Sequence[BlockKey], priority: int = 0,
             timeout: float | None = None) -> LoadResult:
        """Submit and wait."""
        return self.submit(keys, priority).wait(timeout)

    def warm(self, keys: Sequence[BlockKey]) -> LoadTicket:
        """Read ``keys`` into the DRAM cache at prefetch priority, for a warm-up
        (:mod:`~dualpath_cli.storage.warm`): a ticket to wait on (release its result), the
        blocks cached as a request's reads are, but not counted as a request's lookup (the
        hit counters by tier keep meaning what requests found)."""
        ticket = LoadTicket(list(keys), self._lock, self._cancel)
        self._enqueue(ticket, ticket.result.keys, PREFETCH_PRIORITY, None, None, False,
                      count=False)
        return ticket

    def prefetch(self, keys: Sequence[BlockKey], block_tokens: int | None = None) -> int:
        """Read ``keys`` ahead into the DRAM cache at the lowest priority; returns how many
        reads were queued (0 when the cache is disabled)."""
        if self.cache.capacity_bytes == 0:
            return 0
        return self._enqueue(None, list(keys), PREFETCH_PRIORITY, block_tokens, None, True)

    def close(self) -> None:
        """Stop the readers; queued tickets complete with misses. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        for t in self._threads:
            t.join()
        with self._lock:
            leftovers = self._queue.drain()
        finished = self._complete([(p, ReadOp(p.key, missing=True)) for p in leftovers])
        for ticket in finished:
            ticket.finish()
        self.cache.clear()
        store = self.store
        if persists_access_counts(store):
            store.flush_access_counts()

    def __enter__(self) -> StorageLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- queueing ---------------------------------------------------------------------------
    def _enqueue(self, ticket: LoadTicket | None, keys: list[BlockKey], priority: int,
                 block_tokens: int | None, block_nbytes: int | None, prefetch: bool,
                 count: bool = True) -> int:
        now = self.clock()
        tokens = block_tokens or self.block_tokens
        dram_hits = dram_misses = queued = dram_bytes = 0
        why: dict[str, int] = {}
        ages: list[float] = []
        hit_lat: list[float] = []
        with self._lock:
            if self._closed:
                raise RuntimeError("loader is closed")
            est = block_nbytes or self._queue.est_bytes
            for index, key in enumerate(keys):
                cached = (self.cache.get(key, prefetch=ticket is None or not count)
                          if self.cache.capacity_bytes else None)
                if cached is not None:
                    dram_hits += 1
                    if ticket is None:
                        cached[1].release()  # prefetch of a cached block: nothing to do
                        continue
                    ticket.result.blocks[index] = LoadedBlock(key, cached[0], cached[1], "dram")
                    ticket.result.dram_hits += 1
                    dram_bytes += cached[0].file_nbytes
                    ticket.settle()
                    hit_lat.append(self.clock() - now)
                    continue
                dram_misses += 1
                if count and ticket is not None and self.cache.capacity_bytes:
                    reason, age = self.cache.miss_reason(key)
                    why[reason] = why.get(reason, 0) + 1
                    missed = ticket.result.dram_misses
                    missed[reason] = missed.get(reason, 0) + 1
                    if age is not None:
                        ages.append(age)
                pending, new = self._queue.add(key, est, tokens, priority, now, prefetch)
                queued += new
                if ticket is not None:
                    pending.waiters.append((ticket, index))
            if count and self.cache.capacity_bytes:
                self.metrics.count_lookup("dram", dram_hits, dram_misses)
                if dram_hits and ticket is not None:
                    self.metrics.publish_accuracy(self.cache.prefetch_used)
            if queued:
                self.metrics.publish_queue(self._queue)
                wake = min(self._idle, -(-queued // self._queue.min_share()))
                if wake:
                    self._cv.notify(wake)
            done_now = ticket is not None and ticket.remaining == 0
            if done_now:
                assert ticket is not None
                ticket.claim()
        if hit_lat and count:
            self.metrics.m_lat["dram"].observe_many(hit_lat)
        if count and ticket is not None and self.cache.capacity_bytes:
            self.metrics.count_tier(len(keys) * tokens, dram_hits * tokens, dram_bytes, why, ages)
        if done_now:
            assert ticket is not None
            ticket.finish()
        return queued

    def _cancel(self, ticket: LoadTicket) -> int:
        dropped = 0
        with self._lock:
            if not ticket.claim():
                return 0
            for key in ticket.result.keys:
                dropped += self._queue.leave(key, ticket)
            ticket.result.cancelled = True
            ticket.result.reasons = dict.fromkeys(range(len(ticket.result.keys)), "cancelled")
            self.metrics.publish_queue(self._queue)
        if dropped:
            self.metrics.m_cancel.inc(dropped)
        ticket.result.release()
        ticket.result.blocks = [None] * len(ticket.result.keys)
        ticket.finish()
        return dropped

    # --- reader threads ---------------------------------------------------------------------
    def _run(self) -> None:
        piped, split = self._piped, self._split
        pipeline = piped.read_pipeline() if piped is not None else None
        if piped is not None and pipeline is not None:
            try:
                self._run_piped(piped, pipeline)
            finally:
                pipeline.close()
            return
        if split is not None:
            helper = ChecksumHelper()
            try:
                self._run_overlapped(split, helper)
            finally:
                helper.close()
            return
        while True:
            with self._lock:
                while not self._queue.waiting and not self._closed:
                    self._idle += 1
                    self._cv.wait()
                    self._idle -= 1
                if self._closed:
                    return
                batch = self._queue.take()
            if not batch:
                continue
            self._read(batch)

    def _run_overlapped(self, reads: SplitReads, helper: ChecksumHelper) -> None:
        """Read batch i+1 while the helper hashes batch i; then finish batch i.

        Reads stay one at a time (the store's read is synchronous), so reads in flight are
        still bounded by the share: a batch stops counting as in flight once its reads have
        returned, before its checksums are collected.
        """
        prev: _Started | None = None
        free = 0.0  # when this reader last handed a batch over (its service clock restarts)
        while True:
            with self._lock:
                if prev is not None:
                    self._queue.retire(prev.batch)
                while not self._queue.waiting and not self._closed and prev is None:
                    self._idle += 1
                    self._cv.wait()
                    self._idle -= 1
                if self._closed and prev is None:
                    return
                batch = self._queue.take() if not self._closed else []
            started = self._start(reads, batch, helper) if batch else None
            if prev is not None:
                free = self._finish(reads, prev, helper, free)
            if started is not None and started.error is not None:
                helper.drain()  # its checksums were queued after prev's: collected now
            prev = started

    def _run_piped(self, reads: PipelinedReads, pipeline: NativePipeline) -> None:
        """Keep up to ``_PIPE_DEPTH`` batches queued on a native read-then-hash pipeline and
        judge and deliver the oldest meanwhile.

        The pipeline's reader thread copies one block at a time without a pause while its
        hasher hashes the batch before and this thread (all the Python: header checks,
        digest comparisons, hand-outs) works on the one before that, so at queue depth 1 one
        core copies like fio's single job and the rest runs on the other. Reads in flight
        stay one at a time; only the oldest batch counts as in flight.
        """
        queued: deque[tuple[list[PendingRead], list[ReadOp], PipedBatch | None, float]] = deque()
        free = 0.0  # when this thread last handed a batch over (its service clock restarts)
        while True:
            taken: list[list[PendingRead]] = []
            with self._lock:
                while not self._queue.waiting and not self._closed and not queued:
                    self._idle += 1
                    self._cv.wait()
                    self._idle -= 1
                if self._closed and not queued:
                    return
                while (not self._closed and self._queue.waiting
                       and len(queued) + len(taken) < _PIPE_DEPTH):
                    batch = self._queue.take(count=not queued and not taken)
                    if batch:
                        taken.append(batch)
            for batch in taken:
                ops = [ReadOp(p.key) for p in batch]
                piped: PipedBatch | None = None
                started = self.clock()
                try:
                    piped = reads.read_batch_submit(ops, self.pool, pipeline)
                except Exception as err:  # noqa: BLE001 - a store failure must not kill the reader
                    self._fail(ops, err)
                queued.append((batch, ops, piped, started))
            if not queued:
                continue
            batch, ops, piped, started = queued.popleft()
            if piped is not None:
                try:
                    reads.read_batch_collect(piped, pipeline)
                except Exception as err:  # noqa: BLE001 - as above: reported, a miss
                    self._fail(ops, err)
            with self._lock:
                self._queue.retire(batch)
                if queued:
                    self._queue.count(queued[0][0])
            free = self._deliver(batch, ops, started, free)

    def _start(self, reads: SplitReads, batch: list[PendingRead],
               helper: ChecksumHelper) -> _Started:
        ops = [ReadOp(p.key) for p in batch]
        started = _Started(batch, ops, self.clock())
        try:
            started.deferred = reads.read_batch_start(ops, self.pool, helper)
        except Exception as err:  # noqa: BLE001 - a store failure must not kill the reader
            started.error = err
        return started

    def _finish(self, reads: SplitReads, started: _Started, helper: ChecksumHelper,
                free: float) -> float:
        error = started.error
        if error is None and started.deferred:
            try:
                reads.read_batch_finish(started.ops, started.deferred, helper)
            except Exception as err:  # noqa: BLE001 - as above: reported, a miss
                error = err
        if error is not None:
            self._fail(started.ops, error)
        return self._deliver(started.batch, started.ops, started.time, free)

    def _fail(self, ops: list[ReadOp], err: Exception) -> None:
        """An unexpected store failure: every op of the batch is a miss, nothing returned."""
        log.warning("store read failed on node %s: %s", self.node, err)
        for op in ops:
            if op.buffer is not None:
                op.buffer.release()
                op.buffer = None
            text = f"timed out: {err}" if isinstance(err, TimeoutError) else str(err)
            op.header, op.missing, op.io_error = None, True, text

    def _read(self, batch: list[PendingRead]) -> None:
        ops = [ReadOp(p.key) for p in batch]
        started = self.clock()
        try:
            if self._bounded is not None:
                self._bounded.read_batch_bounded(ops, self.pool, self.max_share)
            else:
                self.store.read_batch(ops, self.pool)
        except Exception as err:  # noqa: BLE001 - a store failure must not kill the reader
            self._fail(ops, err)
        self._deliver(batch, ops, started)

    def _deliver(self, batch: list[PendingRead], ops: list[ReadOp], started: float,
                 free: float = 0.0) -> float:
        """Count the store's service time, pace to the emulated NIC, then hand the batch's
        blocks to their tickets; returns when the reader was done with it.

        Service time: from the batch's I/O start (``started``), or from when this reader
        handed its previous batch over (``free``) when that was later (a reader that
        overlaps batches was busy with the one before), to when the store returned it (the
        read hook, a slow-store fault, included). A block's read latency adds its wait in
        the queue and the NIC's pacing; this is the store's own time, which a slow store
        raises by the same amount however many reads queue behind it (issue 33).
        """
        hook = self._read_hook
        io_start = started
        if hook is not None:
            started = hook(ops, started)
        self.metrics.count_service(self.clock() - max(io_start, free))
        read = next((op.key for op in ops if op.header is not None), None)
        if read is not None:
            self.last_store_read = (self.clock(), read)
        if self.shaper.enabled:
            nbytes = sum(op.header.file_nbytes for op in ops if op.header is not None)
            if nbytes:
                self.shaper.wait_until(self.shaper.reserve(nbytes, started))
        finished = self._complete(list(zip(batch, ops, strict=True)))
        for ticket in finished:
            ticket.finish()
        return self.clock()

    def _complete(self, done: list[tuple[PendingRead, ReadOp]]) -> list[LoadTicket]:
        """Deliver results and update counters; returns the tickets that just finished."""
        now = self.clock()
        finished: list[LoadTicket] = []
        latencies: list[float] = []
        read_bytes = hits = misses = prefetched = 0
        corrupt: dict[str, int] = {}
        failed: dict[str, int] = {}
        cache = self.cache
        caching = cache.capacity_bytes > 0
        queue = self._queue
        metrics = self.metrics
        with self._lock:
            for pending, op in done:
                queue.done(pending)
                if op.copy_errors and op.error is None:  # served, but a copy was corrupt
                    reason = op.copy_errors[0].reason
                    corrupt[reason] = corrupt.get(reason, 0) + 1
                waiters = pending.waiters
                header, buf = op.header, op.buffer
                if header is not None and buf is not None:
                    hits += 1
                    read_bytes += header.file_nbytes
                    if pending.prefetch:
                        prefetched += 1
                        metrics.pf_read += 1
                        metrics.pf_joined += bool(waiters)
                    if pending.prefetch or (caching and waiters):
                        cache.put(pending.key, header, buf,
                                  prefetched=pending.prefetch and not waiters)
                    if waiters:
                        # every waiter holds a reference; the last one takes the read's own
                        for ticket, index in waiters[:-1]:
                            ticket.result.blocks[index] = LoadedBlock(
                                pending.key, header, buf.retain(), "store")
                            ticket.result.store_hits += 1
                        ticket, index = waiters[-1]
                        ticket.result.blocks[index] = LoadedBlock(pending.key, header, buf,
                                                                  "store")
                        ticket.result.store_hits += 1
                    else:
                        buf.release()
                else:
                    misses += 1
                    if op.error is not None:
                        corrupt[op.error.reason] = corrupt.get(op.error.reason, 0) + 1
                        cache.discard(pending.key)
                    reason = miss_reason_of(op, self._closed)
                    if op.error is None and op.io_error is not None:
                        failed[reason] = failed.get(reason, 0) + 1
                    for ticket, index in waiters:
                        ticket.result.misses += 1
                        ticket.result.corrupt += op.error is not None
                        ticket.result.reasons[index] = reason
                for ticket, _ in waiters:
                    if ticket.settle():
                        finished.append(ticket)
                latencies.append(now - pending.submitted)
            if read_bytes and not queue.est_bytes:
                queue.est_bytes = read_bytes // hits
            metrics.count_lookup("store", hits, misses)
            metrics.publish_accuracy(cache.prefetch_used)
            metrics.publish_queue(queue)
            metrics.m_cache_bytes.set(cache.bytes)
            metrics.count_bandwidth(now, read_bytes, self.shaper.rate)
        metrics.count_reads(read_bytes, hits, prefetched, corrupt, latencies, failed)
        return finished
