"""Store and loader metrics the table defines: bytes held, capacity evictions, prefetch
accuracy. Values are asserted against what the stores and loader actually did."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from dualpath_cli.core.layout import BlockKey, BlockShape, Namespace, prefix_keys
from dualpath_cli.storage import (
    PREFETCH_PRIORITY,
    BufferPool,
    MemoryStore,
    PosixStore,
    ReadOp,
    StorageLoader,
    encode_block,
    read_one,
)
from dualpath_cli.storage.header import file_nbytes
from dualpath_cli.telemetry import REGISTRY, MetricsRegistry

SHAPE = BlockShape(n_layers=2, block_tokens=16, bytes_per_token_layer=64)
NS = Namespace("m", "layer_major", SHAPE, "fp16")
FILE = file_nbytes(SHAPE.full_nbytes)
KEYS = prefix_keys(list(range(16 * 8)), NS)

BYTES = "dualpath_storage_store_bytes"
EVICTED = "dualpath_storage_evicted_blocks_total"
ACCURACY = "dualpath_prefetch_accuracy_ratio"


def put(store: MemoryStore | PosixStore, keys: list[BlockKey]) -> None:
    for i, key in enumerate(keys):
        store.put(*encode_block(key, np.full((2, 16, 32), i, dtype=np.float16), NS))


def make(kind: str, tmp_path: Path, reg: MetricsRegistry,
         capacity: int | None = None) -> MemoryStore | PosixStore:
    if kind == "memory":
        return MemoryStore(capacity, registry=reg)
    return PosixStore(tmp_path / "store", capacity_bytes=capacity, registry=reg)


# --- bytes held and evictions -----------------------------------------------------------------
@pytest.mark.parametrize("kind", ["memory", "posix"])
@pytest.mark.parametrize("capacity", [None, 100 * FILE])
def test_store_bytes_follow_puts_and_deletes(kind: str, capacity: int | None,
                                             tmp_path: Path) -> None:
    reg = MetricsRegistry()
    store = make(kind, tmp_path, reg, capacity)
    put(store, KEYS[:5])
    assert reg.value(BYTES, root=store.name) == 5 * FILE == store.usage().bytes
    put(store, KEYS[:2])  # already stored: nothing written, nothing counted
    assert reg.value(BYTES, root=store.name) == 5 * FILE
    assert store.delete(KEYS[0]) and not store.delete(KEYS[0])
    assert reg.value(BYTES, root=store.name) == 4 * FILE == store.usage().bytes
    assert reg.value(EVICTED, root=store.name) == 0


@pytest.mark.parametrize("kind", ["memory", "posix"])
def test_capacity_eviction_counts_blocks_and_bytes_stay_under_capacity(
        kind: str, tmp_path: Path) -> None:
    reg = MetricsRegistry()
    store = make(kind, tmp_path, reg, capacity=3 * FILE)
    put(store, KEYS[:7])
    assert reg.value(EVICTED, root=store.name) == 4
    assert reg.value(BYTES, root=store.name) == 3 * FILE == store.usage().bytes
    assert store.usage().blocks == 3


@pytest.mark.parametrize("kind", ["memory", "posix"])
def test_gc_evictions_are_counted(kind: str, tmp_path: Path) -> None:
    reg = MetricsRegistry()
    store = make(kind, tmp_path, reg)
    put(store, KEYS[:6])
    report = store.gc(capacity_bytes=2 * FILE)
    assert report.evicted_blocks == 4
    assert reg.value(EVICTED, root=store.name) == 4
    assert reg.value(BYTES, root=store.name) == 2 * FILE == store.usage().bytes


@pytest.mark.parametrize("kind", ["memory", "posix"])
def test_quarantine_removes_the_block_from_bytes_held(kind: str, tmp_path: Path) -> None:
    reg = MetricsRegistry()
    store = make(kind, tmp_path, reg)
    put(store, KEYS[:3])
    assert store.quarantine(KEYS[1], "checksum") is not None
    assert reg.value(BYTES, root=store.name) == 2 * FILE == store.usage().bytes


def test_posix_store_counts_blocks_already_on_disk(tmp_path: Path) -> None:
    put(PosixStore(tmp_path / "store", registry=MetricsRegistry()), KEYS[:4])
    reg = MetricsRegistry()
    store = PosixStore(tmp_path / "store", registry=reg)
    assert reg.snapshot().get(BYTES) is None  # unknown until needed: opening does not scan
    read_one(store, KEYS[0]).release()  # type: ignore[union-attr]  # reads change nothing
    assert reg.snapshot().get(BYTES) is None
    put(store, KEYS[4:5])  # the first change scans once, then tracks
    assert reg.value(BYTES, root=store.name) == 5 * FILE


def test_posix_store_usage_seeds_bytes_held(tmp_path: Path) -> None:
    put(PosixStore(tmp_path / "store", registry=MetricsRegistry()), KEYS[:3])
    reg = MetricsRegistry()
    store = PosixStore(tmp_path / "store", registry=reg)
    assert store.usage().bytes == 3 * FILE
    assert reg.value(BYTES, root=store.name) == 3 * FILE


def test_capacity_store_reports_bytes_at_open(tmp_path: Path) -> None:
    put(PosixStore(tmp_path / "store", registry=MetricsRegistry()), KEYS[:2])
    reg = MetricsRegistry()
    store = PosixStore(tmp_path / "store", capacity_bytes=10 * FILE, registry=reg)
    assert reg.value(BYTES, root=store.name) == 2 * FILE


def test_stores_default_to_the_process_registry() -> None:
    store = MemoryStore()
    put(store, KEYS[:1])
    assert REGISTRY.value(BYTES, root=store.name) == FILE


# --- prefetch accuracy ------------------------------------------------------------------------
def loaded(n: int) -> tuple[MemoryStore, list[BlockKey]]:
    store = MemoryStore(registry=MetricsRegistry())
    put(store, KEYS[:n])
    return store, KEYS[:n]


def drain(loader: StorageLoader) -> None:
    """Wait until every queued prefetch completed: one reader serves the queue in priority
    order, so a read queued behind them (a miss) finishes after they do."""
    missing = prefix_keys(list(range(10_000, 10_016)), NS)
    result = loader.load(missing, priority=PREFETCH_PRIORITY + 1, timeout=10)
    assert result.misses == 1


def single_reader(store: object, reg: MetricsRegistry) -> StorageLoader:
    return StorageLoader(store, max_inflight=1, workers=1, cache_bytes=16 * FILE,  # type: ignore[arg-type]
                         registry=reg)


def test_prefetch_then_load_is_fully_accurate() -> None:
    store, keys = loaded(4)
    reg = MetricsRegistry()
    with single_reader(store, reg) as loader:
        assert loader.prefetch(keys) == 4
        drain(loader)
        assert reg.value(ACCURACY, node=0) == 0.0  # prefetched, nothing used yet
        result = loader.load(keys, timeout=10)
        assert result.dram_hits == 4 and result.store_hits == 0
        result.release()
        assert reg.value(ACCURACY, node=0) == 1.0
        loader.load(keys, timeout=10).release()  # a block is used once, not per hit
        assert reg.value(ACCURACY, node=0) == 1.0
    assert reg.value("dualpath_storage_prefetched_blocks_total", node=0) == 4


def test_unused_prefetches_lower_accuracy() -> None:
    store, keys = loaded(4)
    reg = MetricsRegistry()
    with single_reader(store, reg) as loader:
        loader.prefetch(keys)
        drain(loader)
        loader.load(keys[:1], timeout=10).release()
        assert reg.value(ACCURACY, node=0) == 0.25
        loader.prefetch(keys)  # already cached: no read, not counted again
        loader.load(keys[1:2], timeout=10).release()
        assert reg.value(ACCURACY, node=0) == 0.5


def test_a_load_joining_an_in_flight_prefetch_uses_it() -> None:
    store, keys = loaded(3)

    class Gated:
        """Holds reads until the gate opens, so the load surely joins the prefetch."""

        def __init__(self) -> None:
            self.gate = threading.Event()

        @property
        def name(self) -> str:
            return "gated"

        def __getattr__(self, item: str) -> object:
            return getattr(store, item)

        def read_batch(self, ops: list[ReadOp], pool: BufferPool) -> None:
            self.gate.wait(10)
            store.read_batch(ops, pool)

    gated = Gated()
    reg = MetricsRegistry()
    with single_reader(gated, reg) as loader:
        loader.prefetch(keys)
        ticket = loader.submit(keys)
        gated.gate.set()
        result = ticket.wait(10)
        assert result.store_hits == 3
        result.release()
    assert reg.value(ACCURACY, node=0) == 1.0


def test_blocks_a_request_read_are_not_prefetches() -> None:
    store, keys = loaded(2)
    reg = MetricsRegistry()
    with single_reader(store, reg) as loader:
        loader.load(keys, timeout=10).release()  # read by a request, now cached
        assert loader.prefetch(keys) == 0
        loader.load(keys, timeout=10).release()
    assert reg.snapshot()[ACCURACY][0]["value"] == 0.0  # bound, never set: no prefetch
