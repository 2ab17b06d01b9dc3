"""StorageLoader: read queue, priorities, cancellation, prefetch, DRAM cache, shaping,
integrity, batched hand-offs. No sleeps: threads are coordinated with events."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from dualpath_cli.core.layout import BlockKey, BlockShape, Namespace, prefix_keys
from dualpath_cli.storage import (
    HEADER_SIZE,
    BufferPool,
    MemoryStore,
    PosixStore,
    ReadOp,
    StorageLoader,
    TokenBucket,
    encode_block,
)
from dualpath_cli.storage.header import file_nbytes
from dualpath_cli.telemetry import MetricsRegistry

SHAPE = BlockShape(n_layers=2, block_tokens=16, bytes_per_token_layer=64)
NS = Namespace("m", "layer_major", SHAPE, "fp16")
FILE = file_nbytes(SHAPE.full_nbytes)


def filled(n: int, store: MemoryStore | PosixStore | None = None):
    store = store if store is not None else MemoryStore()
    keys = prefix_keys(list(range(16 * n)), NS)
    blocks = {}
    for i, key in enumerate(keys):
        block = np.full((2, 16, 32), i, dtype=np.float16)
        blocks[key] = block
        store.put(*encode_block(key, block, NS))
    return store, keys, blocks


class GatedStore:
    """Wraps a store; every read_batch waits for ``gate`` and records the keys read."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.order: list[BlockKey] = []

    @property
    def name(self) -> str:
        return "gated"

    def __getattr__(self, item: str):  # delegate the rest of the protocol
        return getattr(self.inner, item)

    def read_batch(self, ops: list[ReadOp], pool: BufferPool) -> None:
        self.entered.set()
        self.gate.wait(10)
        self.order.extend(op.key for op in ops)
        self.inner.read_batch(ops, pool)


def test_load_returns_identical_blocks_and_counts_metrics() -> None:
    store, keys, blocks = filled(6)
    reg = MetricsRegistry()
    with StorageLoader(store, node=3, role="decode", max_inflight=4, registry=reg) as loader:
        result = loader.load(keys, timeout=10)
        assert result.store_hits == 6 and result.misses == 0 and result.hit_prefix == 6
        for key, block in zip(keys, result.blocks, strict=True):
            assert block is not None and block.array().tobytes() == blocks[key].tobytes()
            np.testing.assert_array_equal(block.layer(1)[0], blocks[key][1])
        result.release()
    assert reg.value("dualpath_storage_read_blocks_total", node=3, role="decode") == 6
    assert reg.value("dualpath_storage_read_bytes_total", node=3, role="decode") == 6 * FILE
    assert reg.value("dualpath_storage_cache_hits_total", node=3, tier="store") == 6
    assert reg.value("dualpath_storage_read_latency_seconds", node=3, tier="store") == 6


def test_missing_blocks_are_misses_and_hit_prefix_stops_there() -> None:
    store, keys, _ = filled(5)
    store.delete(keys[2])
    with StorageLoader(store, max_inflight=2, registry=MetricsRegistry()) as loader:
        result = loader.load(keys, timeout=10)
        assert result.misses == 1 and result.blocks[2] is None and result.hit_prefix == 2
        result.release()


def test_corrupt_block_is_quarantined_reported_as_miss_and_counted(tmp_path: Path) -> None:
    store, keys, blocks = filled(3, PosixStore(tmp_path / "s"))
    path = store.path(keys[1])
    data = bytearray(path.read_bytes())
    data[HEADER_SIZE + 7] ^= 0x10
    path.write_bytes(bytes(data))
    reg = MetricsRegistry()
    with StorageLoader(store, node=0, max_inflight=2, cache_bytes=1 << 20,
                       registry=reg) as loader:
        result = loader.load(keys, timeout=10)
        assert result.blocks[1] is None and result.corrupt == 1 and result.misses == 1
        for i in (0, 2):
            got = result.blocks[i]
            assert got is not None and got.array().tobytes() == blocks[keys[i]].tobytes()
        result.release()
        again = loader.load(keys[1:2], timeout=10)
        assert again.blocks == [None] and again.corrupt == 0  # now plain missing
    assert reg.value("dualpath_storage_corrupt_blocks_total", node=0, reason="checksum") == 1
    assert len(store.quarantined()) == 1


def test_dram_cache_serves_repeats_without_the_store() -> None:
    store, keys, _ = filled(4)
    reg = MetricsRegistry()
    with StorageLoader(store, max_inflight=2, cache_bytes=4 * FILE, registry=reg) as loader:
        loader.load(keys, timeout=10).release()
        reads = store.reads
        second = loader.load(keys, timeout=10)
        assert second.dram_hits == 4 and store.reads == reads
        assert all(b is not None and b.tier == "dram" for b in second.blocks)
        second.release()
        assert reg.value("dualpath_storage_cache_hit_ratio", node=0, tier="dram") == 0.5


def test_cache_is_lru_by_bytes() -> None:
    store, keys, _ = filled(3)
    with StorageLoader(store, max_inflight=1, cache_bytes=2 * FILE,
                       registry=MetricsRegistry()) as loader:
        loader.load(keys[:2], timeout=10).release()
        loader.load(keys[:1], timeout=10).release()  # keys[0] recent
        loader.load(keys[2:3], timeout=10).release()  # evicts keys[1]
        assert keys[0] in loader.cache and keys[1] not in loader.cache
        assert loader.cache.bytes <= 2 * FILE


def test_prefetch_fills_the_cache() -> None:
    store, keys, _ = filled(3)
    reg = MetricsRegistry()
    with StorageLoader(store, max_inflight=2, cache_bytes=8 * FILE, registry=reg) as loader:
        done = threading.Event()
        assert loader.prefetch(keys) == 3
        # a load queued behind the prefetch completes after it (same keys: deduplicated)
        loader.submit(keys).add_done_callback(lambda r: (r.release(), done.set()))
        assert done.wait(10)
        assert all(k in loader.cache for k in keys)
        result = loader.load(keys, timeout=10)
        assert result.dram_hits == 3
        result.release()
    assert reg.value("dualpath_storage_prefetched_blocks_total", node=0) == 3
    assert store.reads == 3


def test_read_queue_counts_blocks_bytes_tokens_and_priorities_order_reads() -> None:
    inner, keys, _ = filled(6)
    store = GatedStore(inner)
    with StorageLoader(store, max_inflight=1, workers=1, block_tokens=16, block_nbytes=FILE,
                       batch_bytes=1, registry=MetricsRegistry()) as loader:
        first = loader.submit(keys[:1])
        assert store.entered.wait(10)  # the reader holds keys[0]
        low = loader.submit(keys[1:3], priority=5)
        high = loader.submit(keys[3:5], priority=1)
        q = loader.read_queue
        assert (q.blocks, q.bytes, q.tokens, q.in_flight) == (5, 5 * FILE, 5 * 16, 1)
        store.gate.set()
        for t in (first, low, high):
            t.wait(10).release()
        assert store.order == [keys[0], keys[3], keys[4], keys[1], keys[2]]
        assert loader.read_queue.blocks == 0


def test_cancel_drops_queued_reads() -> None:
    inner, keys, _ = filled(4)
    store = GatedStore(inner)
    reg = MetricsRegistry()
    with StorageLoader(store, max_inflight=1, workers=1, batch_bytes=1,
                       block_nbytes=FILE, registry=reg) as loader:
        first = loader.submit(keys[:1])
        assert store.entered.wait(10)
        doomed = loader.submit(keys[1:4])
        assert loader.read_queue.blocks == 4
        assert doomed.cancel() == 3
        assert doomed.done() and doomed.result.cancelled
        assert loader.read_queue.blocks == 1
        store.gate.set()
        first.wait(10).release()
    assert store.order == [keys[0]]
    assert reg.value("dualpath_storage_cancelled_reads_total", node=0) == 3


def test_reads_in_flight_are_bounded_and_handoffs_batched() -> None:
    inner, keys, _ = filled(40)
    store = GatedStore(inner)
    batches: list[int] = []
    original = store.read_batch

    def record(ops: list[ReadOp], pool: BufferPool) -> None:
        batches.append(len(ops))
        original(ops, pool)

    store.read_batch = record  # type: ignore[method-assign]
    with StorageLoader(store, max_inflight=4, workers=2, block_nbytes=FILE,
                       batch_bytes=4 * FILE, registry=MetricsRegistry()) as loader:
        ticket = loader.submit(keys)
        assert store.entered.wait(10)
        assert loader.read_queue.in_flight <= 4
        store.gate.set()
        ticket.wait(10).release()
    assert sum(batches) == 40
    assert len(batches) <= 20  # >= 2 blocks per wake-up, never one hand-off per read


def test_duplicate_keys_are_read_once() -> None:
    store, keys, _ = filled(2)
    with StorageLoader(store, max_inflight=1, registry=MetricsRegistry()) as loader:
        result = loader.load([keys[0], keys[0], keys[1]], timeout=10)
        assert result.store_hits == 3
        result.release()
    assert store.reads == 2


def test_buffers_are_reused_across_loads() -> None:
    store, keys, _ = filled(4)
    pool = BufferPool()
    with StorageLoader(store, max_inflight=1, workers=1, pool=pool,
                       registry=MetricsRegistry()) as loader:
        for _ in range(5):
            loader.load(keys, timeout=10).release()
    assert pool.allocated <= 4


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


def test_token_bucket_paces_to_the_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(100e6, clock=clock, sleep=clock.sleep)
    for _ in range(50):
        bucket.wait_until(bucket.reserve(1_000_000, clock()))
    assert clock.now == pytest.approx(0.5, rel=1e-9)  # 50 MB at 100 MB/s
    assert not TokenBucket(None).enabled and TokenBucket(0).rate is None


def test_token_bucket_burst_credit() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1e6, burst_bytes=500_000, clock=clock, sleep=clock.sleep)
    clock.now = 10.0
    assert bucket.reserve(500_000, clock()) == pytest.approx(10.0)  # idle credit
    assert bucket.reserve(1_000_000, clock()) == pytest.approx(11.0)


@pytest.mark.parametrize("rate", [100e6, 2e9])
def test_loader_shaping_matches_the_configured_bandwidth(rate: float) -> None:
    store, keys, _ = filled(50)
    clock = FakeClock()
    reg = MetricsRegistry()
    with StorageLoader(store, max_inflight=1, workers=1, shaping_bps=rate, clock=clock,
                       sleep=clock.sleep, registry=reg) as loader:
        loader.load(keys, timeout=10).release()
    assert 50 * FILE / clock.now == pytest.approx(rate, rel=1e-6)
    assert reg.value("dualpath_storage_shaped_bandwidth_bytes_per_second", node=0) == rate


def test_close_completes_queued_tickets_as_misses() -> None:
    inner, keys, _ = filled(3)
    store = GatedStore(inner)
    loader = StorageLoader(store, max_inflight=1, workers=1, batch_bytes=1, block_nbytes=FILE,
                           registry=MetricsRegistry())
    first = loader.submit(keys[:1])
    assert store.entered.wait(10)
    queued = loader.submit(keys[1:])
    store.gate.set()
    loader.close()
    assert queued.wait(10).misses == 2
    first.wait(10).release()
    with pytest.raises(RuntimeError, match="closed"):
        loader.submit(keys)


def test_service_time_is_the_stores_own_time_not_the_queue_before_it() -> None:
    """A store that takes 200 ms a batch (the read_latency fault's hook): seven blocks
    queued behind the first batch wait for it, so their read latency is 400 ms, while the
    store's service time stays 200 ms a batch."""
    store, keys, _ = filled(8)
    clock = FakeClock()
    reg = MetricsRegistry()
    entered, gate = threading.Event(), threading.Event()

    def slow(ops: list[ReadOp], started: float) -> float:
        if not entered.is_set():  # hold the first batch until the rest is queued
            entered.set()
            gate.wait(10)
        clock.sleep(0.2)
        return max(started, clock())

    with StorageLoader(store, max_inflight=1, workers=1, block_nbytes=FILE, clock=clock,
                       sleep=clock.sleep, registry=reg) as loader:
        loader.set_read_hook(slow)
        first = loader.submit(keys[:1])
        assert entered.wait(10)
        rest = loader.submit(keys[1:])
        gate.set()
        first.wait(10).release()
        rest.wait(10).release()
    service = reg.histogram("dualpath_storage_read_service_seconds", node=0)
    latency = reg.histogram("dualpath_storage_read_latency_seconds", node=0, tier="store")
    assert service.count == 2 and latency.count == 8
    assert service.sum / service.count == pytest.approx(0.2)
    assert latency.sum / latency.count == pytest.approx((0.2 + 7 * 0.4) / 8)
