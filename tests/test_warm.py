"""Warm-up (issue 14 item 7): the Warmer fills a loader's DRAM cache under its cap, a warmed
prefix then hits DRAM where a cold one reads the store, and bad template files are refused."""

from __future__ import annotations

import numpy as np

from dualpath_cli.core.layout import BlockKey, BlockShape, Namespace, prefix_keys
from dualpath_cli.storage import MemoryStore, StorageLoader, encode_block
from dualpath_cli.storage.header import file_nbytes
from dualpath_cli.storage.warm import Warmer
from dualpath_cli.telemetry.registry import MetricsRegistry

SHAPE = BlockShape(2, 16, 64)
NS = Namespace("m", "layer_major", SHAPE, "fp16")
BLOCK = file_nbytes(SHAPE.full_nbytes)


def _store(tokens: list[int]) -> tuple[MemoryStore, list[BlockKey]]:
    store = MemoryStore()
    keys = prefix_keys(tokens, NS)
    for i, key in enumerate(keys):
        store.put(*encode_block(key, np.full((2, 16, 32), i, dtype=np.float16), NS))
    return store, keys


class FakeClock:
    """Time that moves only when the limiter sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


def _value(reg: MetricsRegistry, name: str) -> float:
    return sum(row["value"] for row in reg.snapshot().get(name, []))


def test_warm_fills_the_cache_then_a_request_hits_dram() -> None:
    tokens = list(range(16 * 12))
    store, keys = _store(tokens)
    reg = MetricsRegistry()
    with StorageLoader(store, cache_bytes=64 * BLOCK, registry=reg) as loader:
        clock = FakeClock()
        warmer = Warmer(loader, keys, 50 * BLOCK, block_nbytes=BLOCK, registry=reg,
                        clock=clock, sleep=clock.sleep)
        progress = warmer.run()
        assert progress.state == "done" and progress.read == len(keys)
        assert progress.bytes == len(keys) * BLOCK and progress.remaining == 0
        assert _value(reg, "dualpath_storage_warm_bytes_total") == len(keys) * BLOCK
        assert _value(reg, "dualpath_storage_warm_blocks_remaining") == 0
        # the warm-up's own reads are not a request's lookup: no DRAM lookups counted
        hits = {r["labels"]["tier"]: r["value"]
                for r in reg.snapshot()["dualpath_storage_cache_misses_total"]}
        assert hits.get("dram", 0) == 0
        result = loader.load(keys, timeout=10)
        try:
            assert result.dram_hits == len(keys) and result.store_hits == 0
        finally:
            result.release()


def test_a_cold_loader_reads_the_store() -> None:
    store, keys = _store(list(range(16 * 4)))
    with StorageLoader(store, cache_bytes=64 * BLOCK, registry=MetricsRegistry()) as loader:
        result = loader.load(keys, timeout=10)
        try:
            assert result.store_hits == len(keys) and result.dram_hits == 0
        finally:
            result.release()


def test_the_limiter_holds_the_cap_on_its_own_accounting() -> None:
    store, keys = _store(list(range(16 * 40)))
    rate = 4.5 * BLOCK  # bytes/s: one-block chunks, one every ~0.22 s of fake time
    with StorageLoader(store, cache_bytes=64 * BLOCK, registry=MetricsRegistry()) as loader:
        clock = FakeClock()
        warmer = Warmer(loader, keys, rate, block_nbytes=BLOCK, chunk_s=0.5,
                        clock=clock, sleep=clock.sleep)
        t0 = clock.now
        progress = warmer.run()
    assert progress.read == len(keys)
    assert warmer.chunk == 2 and len(warmer.submits) == len(keys) // 2
    for at, before in warmer.submits:  # chunk k starts only once 0..k-1 fit under the cap
        assert before <= rate * (at - t0) + 1e-6
    # and it does not dawdle either: the whole warm-up took what the cap allows
    assert abs((clock.now - t0) - len(keys) * BLOCK / rate) < 1e-6


def test_already_cached_and_missing_blocks_are_counted_apart() -> None:
    store, keys = _store(list(range(16 * 6)))
    gone = BlockKey(b"\x01" * 16)
    with StorageLoader(store, cache_bytes=64 * BLOCK, registry=MetricsRegistry()) as loader:
        loader.load(keys[:2], timeout=10).release()  # two already in DRAM
        clock = FakeClock()
        progress = Warmer(loader, [*keys, gone], 1e9, block_nbytes=BLOCK, clock=clock,
                          sleep=clock.sleep).run()
    assert (progress.read, progress.cached, progress.missing) == (4, 2, 1)
    assert progress.state == "done" and progress.bytes == 4 * BLOCK


def test_stop_ends_a_warm_up_early() -> None:
    store, keys = _store(list(range(16 * 8)))
    with StorageLoader(store, cache_bytes=64 * BLOCK, registry=MetricsRegistry()) as loader:
        warmer = Warmer(loader, keys, BLOCK / 60, block_nbytes=BLOCK)  # a block a minute
        warmer.start()
        warmer.stop()  # interrupts the limiter's wait (a minute) at once
        progress = warmer.wait(10)
    assert progress.state == "stopped" and progress.done < len(keys)
