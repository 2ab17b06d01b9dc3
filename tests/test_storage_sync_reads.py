"""The page-cache read path: one preadv per block sized without fstat, short reads finished,
checksums overlapped on a helper thread, and that none of it weakens verification."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest
from storage_blocks import BIG, assert_loads_identical, hinted_store, page_cache, put_blocks

from dualpath_cli.core.layout import BlockShape
from dualpath_cli.storage import (
    BufferPool,
    PosixStore,
    ReadOp,
    StorageLoader,
    engines,
    reads,
)
from dualpath_cli.storage.engines import OFFLOAD_MIN_BYTES, ChecksumHelper
from dualpath_cli.storage.header import HEADER_SIZE, file_nbytes
from dualpath_cli.storage.native import native_reader, native_status
from dualpath_cli.storage.store import SplitReads
from dualpath_cli.telemetry import MetricsRegistry

SMALL = BlockShape(n_layers=1, block_tokens=16, bytes_per_token_layer=256)  # 4 KiB payload
assert BIG.full_nbytes >= OFFLOAD_MIN_BYTES > SMALL.full_nbytes


@pytest.fixture(autouse=True, params=["pipeline", "native", "python"])
def read_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs on the native path (when it builds here) and on the Python one; an
    overlapping loader runs on the native pipeline, and on the checksum helper with native
    reads ("native") or Python ones."""
    if request.param in ("pipeline", "native"):
        native = native_reader()
        if native is None or (request.param == "pipeline" and not native.hashes):
            pytest.skip(f"native read path unavailable: {native_status()}")
        if request.param == "native":
            monkeypatch.setattr(reads.PageCacheReads, "read_pipeline", lambda self: None)
    else:
        monkeypatch.setattr(reads, "native_reader", lambda: None)
        monkeypatch.setattr(engines, "native_reader", lambda: None)
    return str(request.param)


def read(store: PosixStore, keys: list, pool: BufferPool) -> list[ReadOp]:
    ops = [ReadOp(k) for k in keys]
    store.read_batch(ops, pool)
    return ops


def same(op: ReadOp, block: np.ndarray) -> bool:
    assert op.header is not None and op.buffer is not None
    return bytes(op.buffer.payload(op.header.payload_len)) == block.tobytes()


def corrupt_payload(store: PosixStore, key: object) -> None:
    path = store.path(key)  # type: ignore[arg-type]
    raw = bytearray(path.read_bytes())
    raw[HEADER_SIZE + 1000] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_mixed_sizes_read_whole_whatever_the_last_size(tmp_path: Path) -> None:
    store = hinted_store(tmp_path)
    assert isinstance(store.read_path(), SplitReads)
    blocks = {**put_blocks(store, SMALL, 3, 1), **put_blocks(store, BIG, 3, 2)}
    keys = list(blocks)
    pool = BufferPool()
    # small then big (the buffer sized by the last file is too small), big then small
    for order in (keys, keys[::-1], keys[::2] + keys[1::2]):
        ops = read(store, order, pool)
        for op in ops:
            assert same(op, blocks[op.key])
            assert op.buffer is not None and op.buffer.capacity >= op.header.file_nbytes  # type: ignore[union-attr]
            op.buffer.release()
    assert store.quarantined() == []


def test_short_reads_are_finished_not_called_truncated(tmp_path: Path, read_path: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A FUSE daemon or a signal may split a read: the rest is read before any verdict.
    (The native path's C loop does the same; Python's preadv is what can be split here.)"""
    if read_path != "python":
        pytest.skip("splits Python's preadv")
    store = hinted_store(tmp_path)
    blocks = put_blocks(store, BIG, 4, 3)
    real = os.preadv

    def split(fd: int, buffers: list, offset: int) -> int:
        first = buffers[0]
        if len(first) > 5000:  # return at most ~5000 bytes per call
            return real(fd, [first[:5000]], offset)
        return real(fd, [first], offset)

    monkeypatch.setattr(reads.os, "preadv", split)
    ops = read(store, list(blocks), BufferPool())
    assert all(same(op, blocks[op.key]) for op in ops)
    assert store.quarantined() == []


@pytest.mark.parametrize("cut", ["payload", "header"])
def test_truncated_files_are_quarantined(tmp_path: Path, cut: str) -> None:
    store = hinted_store(tmp_path)
    blocks = put_blocks(store, BIG, 3, 4)
    keys = list(blocks)
    path = store.path(keys[1])
    size = 100 if cut == "header" else HEADER_SIZE + 5000
    path.write_bytes(path.read_bytes()[:size])
    ops = read(store, keys, BufferPool())
    assert ops[1].header is None and ops[1].buffer is None
    assert ops[1].error is not None and ops[1].error.reason == "truncated"
    assert same(ops[0], blocks[keys[0]]) and same(ops[2], blocks[keys[2]])
    assert len(store.quarantined()) == 1


def test_a_longer_file_than_its_header_claims_still_verifies(tmp_path: Path) -> None:
    store = hinted_store(tmp_path)
    blocks = put_blocks(store, BIG, 2, 5)
    keys = list(blocks)
    with open(store.path(keys[0]), "ab") as fh:
        fh.write(b"\x00" * 4096)  # trailing bytes past the padded payload
    ops = read(store, keys, BufferPool())
    assert same(ops[0], blocks[keys[0]]) and same(ops[1], blocks[keys[1]])


def test_checksum_helper_returns_digests_in_order_and_drains() -> None:
    from dualpath_cli.storage.header import payload_checksum

    pool = BufferPool()
    bufs = []
    for i in range(5):
        buf = pool.acquire(HEADER_SIZE + 300_000)
        buf.payload(300_000)[:] = i
        bufs.append(buf)
    want = [payload_checksum(b.payload_view(300_000 - i)) for i, b in enumerate(bufs)]
    helper = ChecksumHelper()
    try:
        for i, buf in enumerate(bufs):
            helper.submit(buf, 300_000 - i)
        helper.flush()
        helper.submit(bufs[0], 100)  # a second batch while the first may still be hashing
        helper.flush()
        assert [helper.result() for _ in range(3)] == want[:3]
        helper.drain()
        assert helper.pending == 0
        helper.submit(bufs[4], 300_000 - 4)
        assert helper.result() == want[4]
    finally:
        helper.close()


def overlapped(store: PosixStore, monkeypatch: pytest.MonkeyPatch,
               max_inflight: int = 1) -> StorageLoader:
    monkeypatch.setattr(os, "cpu_count", lambda: 4)  # a core to spare for the helper
    loader = StorageLoader(store, max_inflight=max_inflight, registry=MetricsRegistry(),
                           block_nbytes=file_nbytes(BIG.full_nbytes))
    assert loader._overlap
    return loader


def test_overlapped_checksums_deliver_identical_blocks(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    store = hinted_store(tmp_path)
    blocks = {**put_blocks(store, BIG, 12, 6), **put_blocks(store, SMALL, 4, 7)}
    keys = list(blocks)
    with overlapped(store, monkeypatch) as loader:
        assert_loads_identical(loader, keys, blocks, rounds=2)


def test_overlapped_checksums_never_return_a_corrupt_block(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    store = hinted_store(tmp_path)
    blocks = put_blocks(store, BIG, 10, 8)
    keys = list(blocks)
    for bad in (keys[0], keys[4], keys[9]):
        corrupt_payload(store, bad)
    reg = MetricsRegistry()
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    with StorageLoader(store, max_inflight=1, registry=reg) as loader:
        assert loader._overlap
        result = loader.load(keys, timeout=30)
        assert result.misses == 3 and result.corrupt == 3 and result.store_hits == 7
        for i, (key, block) in enumerate(zip(keys, result.blocks, strict=True)):
            if i in (0, 4, 9):
                assert block is None
            else:  # the digests after a mismatch still belong to their own blocks
                assert block is not None and np.array_equal(block.array(), blocks[key])
        result.release()
    assert len(store.quarantined()) == 3
    assert reg.value("dualpath_storage_corrupt_blocks_total", node=0, reason="checksum") == 3


def test_a_failed_checksum_is_a_miss_not_quarantine(tmp_path: Path, read_path: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    if read_path != "python":
        pytest.skip("the native hasher only computes; the Python helper can fail")
    store = hinted_store(tmp_path)
    blocks = put_blocks(store, BIG, 6, 9)
    keys = list(blocks)
    real = ChecksumHelper._hash
    calls = [0]

    def flaky(self: ChecksumHelper, batch: list) -> list:
        out = real(self, batch)
        calls[0] += 1
        if calls[0] == 1:  # the first payload of the first batch could not be hashed
            out[0] = MemoryError("simulated")
        return out

    monkeypatch.setattr(ChecksumHelper, "_hash", flaky)
    with overlapped(store, monkeypatch) as loader:
        result = loader.load(keys, timeout=30)
        assert result.misses == 1 and result.corrupt == 0 and result.store_hits == 5
        assert result.blocks[0] is None
        for key, block in zip(keys, result.blocks, strict=True):
            assert block is None or np.array_equal(block.array(), blocks[key])
        result.release()
        again = loader.load(keys, timeout=30)  # the helper is still in step
        assert again.store_hits == 6
        again.release()
    assert store.quarantined() == []


def test_overlapped_reads_in_flight_stay_bounded(tmp_path: Path, read_path: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    if read_path == "pipeline":
        pytest.skip("the helper's split read; the pipeline has its own test")
    store = hinted_store(tmp_path)
    blocks = put_blocks(store, BIG, 24, 10)
    keys = list(blocks)
    seen: list[int] = []
    with overlapped(store, monkeypatch) as loader:
        path = page_cache(store)
        original = path.read_batch_start

        def record(ops: list[ReadOp], pool: BufferPool, helper: ChecksumHelper) -> list:
            seen.append(loader.read_queue.in_flight)
            return original(ops, pool, helper)

        path.read_batch_start = record  # type: ignore[method-assign]
        result = loader.load(keys, timeout=30)
        assert result.store_hits == 24
        result.release()
    assert seen and max(seen) <= 1


def test_a_store_failure_mid_overlap_is_misses_then_recovers(tmp_path: Path, read_path: str,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    if read_path == "pipeline":
        pytest.skip("the helper's split read; the pipeline has its own test")
    store = hinted_store(tmp_path)
    from dualpath_cli.storage import block_queue

    monkeypatch.setattr(block_queue, "_SYNC_BATCH_BYTES", 4 << 20)
    blocks = put_blocks(store, BIG, 40, 11)  # batches of 16 blocks (4 MiB): 16, 16, 8
    keys = list(blocks)
    with overlapped(store, monkeypatch) as loader:
        path = page_cache(store)
        original = path.read_batch_start
        calls = [0]
        lock = threading.Lock()

        def failing(ops: list[ReadOp], pool: BufferPool, helper: ChecksumHelper) -> list:
            with lock:
                calls[0] += 1
                n = calls[0]
            out = original(ops, pool, helper)  # checksums queued, then the store fails
            if n == 2:  # batch 1's checksums are still being collected
                raise OSError("simulated store failure")
            return out

        path.read_batch_start = failing  # type: ignore[method-assign]
        result = loader.load(keys, timeout=30)
        assert result.misses == 16 and result.corrupt == 0
        for key, block in zip(keys, result.blocks, strict=True):
            assert block is None or np.array_equal(block.array(), blocks[key])
        result.release()
        again = loader.load(keys, timeout=30)
        assert again.store_hits == 40
        again.release()
        assert loader.pool.allocated - loader.pool.free_bytes // file_nbytes(
            BIG.full_nbytes) == 0  # every buffer came back
    assert store.quarantined() == []
