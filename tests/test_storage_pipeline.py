"""The native read-then-hash pipeline and the loader mode built on it: the same bytes and the
same verdicts as every other read path, reads in flight still bounded, failures are misses."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from storage_blocks import BIG, assert_loads_identical, hinted_store, page_cache, put_blocks

from dualpath_cli.storage import BufferPool, PosixStore, ReadOp, StorageLoader
from dualpath_cli.storage.header import HEADER_SIZE, file_nbytes, payload_checksum
from dualpath_cli.storage.native import NativePipeline, native_reader, native_status
from dualpath_cli.storage.store import PipedBatch
from dualpath_cli.telemetry import MetricsRegistry


@pytest.fixture()
def pipeline() -> NativePipeline:
    native = native_reader()
    made = native.pipeline() if native is not None else None
    if made is None:
        pytest.skip(f"native pipeline unavailable: {native_status()}")
    return made


def piped_loader(store: PosixStore, monkeypatch: pytest.MonkeyPatch,
                 registry: MetricsRegistry | None = None) -> StorageLoader:
    monkeypatch.setattr(os, "cpu_count", lambda: 4)  # a core to spare: the overlapped mode
    return StorageLoader(store, max_inflight=1, registry=registry or MetricsRegistry(),
                         block_nbytes=file_nbytes(BIG.full_nbytes))


def spy_submits(store: PosixStore) -> list[int]:
    """Count pipelined submissions (an instance attribute shadows the method)."""
    calls: list[int] = []
    path = page_cache(store)
    real = path.read_batch_submit

    def submit(ops: list[ReadOp], pool: BufferPool, pipe: NativePipeline) -> PipedBatch:
        calls.append(len(ops))
        return real(ops, pool, pipe)

    path.read_batch_submit = submit  # type: ignore[method-assign]
    return calls


def test_jobs_come_back_in_order_with_the_payload_digests(tmp_path: Path,
                                                          pipeline: NativePipeline) -> None:
    store = PosixStore(tmp_path)
    blocks = put_blocks(store, BIG, 6, 1)
    keys = list(blocks)
    size = file_nbytes(BIG.full_nbytes)
    pool = BufferPool()
    try:
        jobs = []
        for part in (keys[:2], keys[2:5], keys[5:] + [keys[0]]):
            bufs = [pool.acquire(size) for _ in part]
            paths = [os.fsencode(store.path(k)) for k in part]
            jobs.append((part, bufs, pipeline.submit(paths, [b.addr for b in bufs],
                                                     [b.capacity for b in bufs])))
        for part, bufs, job in jobs:
            nread, digests = pipeline.collect(job)
            assert nread == [size] * len(part)
            for key, buf, digest in zip(part, bufs, digests, strict=True):
                payload = buf.payload_view(BIG.full_nbytes)
                assert bytes(payload) == blocks[key].tobytes()
                assert digest == payload_checksum(payload)
                buf.release()
    finally:
        pipeline.close()


def test_missing_and_short_files_get_no_digest(tmp_path: Path,
                                               pipeline: NativePipeline) -> None:
    store = PosixStore(tmp_path)
    keys = list(put_blocks(store, BIG, 2, 2))
    cut = store.path(keys[1])
    cut.write_bytes(cut.read_bytes()[:HEADER_SIZE + 1000])  # claims more than it holds
    pool = BufferPool()
    bufs = [pool.acquire(file_nbytes(BIG.full_nbytes)) for _ in range(3)]
    paths = [os.fsencode(store.path(keys[0])), os.fsencode(cut),
             os.fsencode(tmp_path / "nowhere.kv")]
    try:
        job = pipeline.submit(paths, [b.addr for b in bufs], [b.capacity for b in bufs])
        nread, digests = pipeline.collect(job)
        assert nread[1] == HEADER_SIZE + 1000 and digests[1] is None
        assert nread[2] == -errno.ENOENT and digests[2] is None
        assert digests[0] is not None
        with pytest.raises(RuntimeError):
            pipeline.collect(job)  # collected once only
    finally:
        pipeline.close()
        for buf in bufs:
            buf.release()


def test_close_collects_outstanding_jobs(tmp_path: Path, pipeline: NativePipeline) -> None:
    store = PosixStore(tmp_path)
    keys = list(put_blocks(store, BIG, 4, 3))
    pool = BufferPool()
    bufs = [pool.acquire(file_nbytes(BIG.full_nbytes)) for _ in keys]
    for key, buf in zip(keys, bufs, strict=True):
        pipeline.submit([os.fsencode(store.path(key))], [buf.addr], [buf.capacity])
    pipeline.close()  # must wait for the reads into bufs before they can be reused
    pipeline.close()
    with pytest.raises(RuntimeError):
        pipeline.submit([], [], [])
    for buf in bufs:
        assert bytes(buf.header[:8]) == b"DPKVBLK\x00"
        buf.release()


def test_loader_on_the_pipeline_delivers_identical_blocks(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          pipeline: NativePipeline) -> None:
    pipeline.close()  # only its availability matters here
    store = PosixStore(tmp_path, engine="preadv")  # no size hint: the first batch is sync
    blocks = put_blocks(store, BIG, 30, 4)
    keys = list(blocks)
    calls = spy_submits(store)
    seen: list[int] = []
    with piped_loader(store, monkeypatch) as loader:
        path = page_cache(store)
        real = path.read_batch_collect

        def collect(batch: PipedBatch, pipe: NativePipeline) -> None:
            seen.append(loader.read_queue.in_flight)
            real(batch, pipe)

        path.read_batch_collect = collect  # type: ignore[method-assign]
        assert_loads_identical(loader, keys, blocks, rounds=3)
    assert sum(calls) >= 3 * len(keys) - 1 and len(calls) >= 3
    assert seen and max(seen) <= 1  # one read at a time, however many batches are queued


def test_loader_on_the_pipeline_never_returns_a_corrupt_block(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pipeline: NativePipeline) -> None:
    pipeline.close()  # only its availability matters here
    store = hinted_store(tmp_path)
    blocks = put_blocks(store, BIG, 12, 5)
    keys = list(blocks)
    for bad in (keys[0], keys[5], keys[11]):
        path = store.path(bad)
        raw = bytearray(path.read_bytes())
        raw[HEADER_SIZE + 777] ^= 0x40
        path.write_bytes(bytes(raw))
    calls = spy_submits(store)
    reg = MetricsRegistry()
    with piped_loader(store, monkeypatch, reg) as loader:
        result = loader.load(keys, timeout=30)
        assert result.misses == 3 and result.corrupt == 3 and result.store_hits == 9
        for i, (key, block) in enumerate(zip(keys, result.blocks, strict=True)):
            if i in (0, 5, 11):
                assert block is None
            else:
                assert block is not None and np.array_equal(block.array(), blocks[key])
        result.release()
    assert calls
    assert len(store.quarantined()) == 3
    assert reg.value("dualpath_storage_corrupt_blocks_total", node=0, reason="checksum") == 3


def test_a_store_failure_on_the_pipeline_is_misses_then_recovers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pipeline: NativePipeline) -> None:
    pipeline.close()  # only its availability matters here
    store = hinted_store(tmp_path)
    blocks = put_blocks(store, BIG, 40, 6)  # 10 MiB: batches of 8 MiB (32 blocks) and 8 blocks
    keys = list(blocks)
    path = page_cache(store)
    real = path.read_batch_submit
    count = [0]
    lock = threading.Lock()

    def failing(ops: list[ReadOp], pool: BufferPool, pipe: NativePipeline) -> PipedBatch:
        with lock:
            count[0] += 1
            n = count[0]
        if n == 2:
            raise OSError("simulated store failure")
        return real(ops, pool, pipe)

    path.read_batch_submit = failing  # type: ignore[method-assign]
    with piped_loader(store, monkeypatch) as loader:
        result = loader.load(keys, timeout=30)
        assert result.misses == 8 and result.corrupt == 0 and result.store_hits == 32
        for key, block in zip(keys, result.blocks, strict=True):
            assert block is None or np.array_equal(block.array(), blocks[key])
        result.release()
        again = loader.load(keys, timeout=30)
        assert again.store_hits == 40
        again.release()
        size = file_nbytes(BIG.full_nbytes)
        assert loader.pool.allocated - loader.pool.free_bytes // size == 0  # all came back
    assert store.quarantined() == []


def test_closing_the_loader_with_batches_queued_finishes_every_ticket(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pipeline: NativePipeline) -> None:
    pipeline.close()  # only its availability matters here
    store = hinted_store(tmp_path)
    blocks = put_blocks(store, BIG, 64, 7)
    keys = list(blocks)
    loader = piped_loader(store, monkeypatch)
    tickets = [loader.submit(keys[i:i + 4]) for i in range(0, len(keys), 4)]
    loader.close()
    for ticket in tickets:
        result = ticket.wait(timeout=30)
        assert result.store_hits + result.misses == 4
        for key, block in zip(result.keys, result.blocks, strict=True):
            assert block is None or np.array_equal(block.array(), blocks[key])
        result.release()


def test_many_small_jobs_stay_in_step(tmp_path: Path, pipeline: NativePipeline) -> None:
    """Hundreds of jobs of 0-5 files, up to four outstanding, a mix of good, missing and cut
    files: every result belongs to its own job and file."""
    import random

    store = PosixStore(tmp_path)
    blocks = put_blocks(store, BIG, 8, 8)
    keys = list(blocks)
    cut = store.path(keys[7])
    cut.write_bytes(cut.read_bytes()[:HEADER_SIZE + 100])
    size = file_nbytes(BIG.full_nbytes)
    names = [os.fsencode(store.path(k)) for k in keys] + [os.fsencode(tmp_path / "gone.kv")]
    rng = random.Random(1)
    pool = BufferPool()
    outstanding: list[tuple[list[int], list, object]] = []
    checked = 0
    try:
        for _ in range(300):
            picks = [rng.randrange(len(names)) for _ in range(rng.randrange(6))]
            bufs = [pool.acquire(size) for _ in picks]
            job = pipeline.submit([names[i] for i in picks], [b.addr for b in bufs],
                                  [b.capacity for b in bufs])
            outstanding.append((picks, bufs, job))
            while len(outstanding) > 4 or (outstanding and rng.random() < 0.3):
                picks, bufs, job = outstanding.pop(0)
                nread, digests = pipeline.collect(job)  # type: ignore[arg-type]
                for i, buf, got, digest in zip(picks, bufs, nread, digests, strict=True):
                    if i == len(keys):  # the missing file
                        assert got == -errno.ENOENT and digest is None
                    elif i == 7:  # the cut file: its header claims more than was read
                        assert got == HEADER_SIZE + 100 and digest is None
                    else:
                        assert got == size
                        payload = buf.payload_view(BIG.full_nbytes)
                        assert bytes(payload) == blocks[keys[i]].tobytes()
                        assert digest == payload_checksum(payload)
                    checked += 1
                    buf.release()
    finally:
        pipeline.close()
    assert checked > 500
