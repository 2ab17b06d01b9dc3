"""Read engines and the fast read path: pipelined io_uring batches, GIL-free checksums,
memoised header decoding, and that none of it weakens verification."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
import xxhash

from dualpath_cli.core.layout import BlockShape, Namespace, prefix_keys
from dualpath_cli.storage import (
    BufferPool,
    ChecksumMismatch,
    ForeignHeader,
    PosixStore,
    ReadOp,
    StorageLoader,
    encode_block,
    read_one,
    uring_status,
)
from dualpath_cli.storage import reads as reads_mod
from dualpath_cli.storage.engines import PreadvEngine, ReadJob, UringEngine
from dualpath_cli.storage.header import (
    HEADER_SIZE,
    BlockHeader,
    pack_header,
    payload_checksum,
    unpack_header,
)
from dualpath_cli.storage.reads import EngineReads, UringReads
from dualpath_cli.storage.store import BoundedReads, PipelinedReads, SplitReads
from dualpath_cli.telemetry import MetricsRegistry

SHAPE = BlockShape(n_layers=2, block_tokens=16, bytes_per_token_layer=2048)  # 64 KiB payload
NS = Namespace("m", "layer_major", SHAPE, "fp16")
uring = pytest.mark.skipif(not uring_status()[0], reason="io_uring not usable here")


def filled(root: Path, n: int, **kw: object) -> tuple[PosixStore, list, dict]:
    store = PosixStore(root, **kw)  # type: ignore[arg-type]
    keys = prefix_keys(list(range(16 * n)), NS)
    blocks = {}
    for i, key in enumerate(keys):
        block = np.full((2, 16, 1024), i, dtype=np.float16)
        blocks[key] = block
        store.put(*encode_block(key, block, NS))
    return store, keys, blocks


@pytest.mark.parametrize("nbytes", [0, 100, 32 << 10, (32 << 10) + 1, 1 << 20])
def test_payload_checksum_is_xxh3_64_whatever_the_path(nbytes: int) -> None:
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    want = xxhash.xxh3_64_intdigest(data.tobytes())
    assert payload_checksum(data) == want
    assert payload_checksum(memoryview(data)) == want
    assert payload_checksum(data.tobytes()) == want


def test_header_decoding_is_memoised_but_exact() -> None:
    keys = prefix_keys(list(range(32)), NS)
    headers = [BlockHeader(key=k, shape=SHAPE, layout="layer_major", dtype="fp16",
                           codec="fp16", namespace=label, payload_len=SHAPE.full_nbytes,
                           checksum=i, created_ns=i)
               for i, (k, label) in enumerate(zip(keys, ["a", "b"], strict=True))]
    for h in headers * 2:  # second pass hits the memo
        assert unpack_header(pack_header(h), "p", expected_key=h.key) == h
    with pytest.raises(ForeignHeader, match="belongs to block"):
        unpack_header(pack_header(headers[0]), "p", expected_key=headers[1].key)
    raw = bytearray(pack_header(headers[0]))
    raw[100] ^= 1
    with pytest.raises(ChecksumMismatch):
        unpack_header(raw, "p")


@uring
@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("in_flight", [1, 3, None])
def test_pipelined_batches_read_verify_and_quarantine(tmp_path: Path, direct: bool,
                                                      in_flight: int | None) -> None:
    store, keys, blocks = filled(tmp_path, 9, engine="io_uring", direct=direct)
    assert isinstance(store.read_path(), BoundedReads)
    with open(store.path(keys[4]), "r+b") as fh:  # flip a payload byte of block 4
        fh.seek(HEADER_SIZE + 7)
        byte = fh.read(1)
        fh.seek(HEADER_SIZE + 7)
        fh.write(bytes([byte[0] ^ 0xFF]))
    store.delete(keys[6])
    ops = [ReadOp(k) for k in keys]
    store.read_batch(ops, BufferPool(), max_in_flight=in_flight)
    for i, op in enumerate(ops):
        if i == 4:
            assert op.error is not None and op.buffer is None and op.header is None
        elif i == 6:
            assert op.missing and op.buffer is None
        else:
            assert op.ok and op.buffer is not None and op.header is not None
            got = op.buffer.payload(op.header.payload_len).view(np.float16)
            assert np.array_equal(got.reshape(2, 16, 1024), blocks[keys[i]])
            op.buffer.release()
    assert len(store.quarantined()) == 1
    assert read_one(store, keys[4]) is None  # quarantined: a miss from now on


@uring
def test_uring_engine_drains_the_ring_when_verification_raises(tmp_path: Path) -> None:
    """A callback that raises must not leave reads in flight into reusable buffers."""
    paths = []
    for i in range(6):
        p = tmp_path / f"f{i}"
        p.write_bytes(bytes([i]) * 8192)
        paths.append(p)
    engine = UringEngine(depth=8)
    bufs = [bytearray(8192) for _ in paths]

    def jobs() -> list[ReadJob]:
        return [ReadJob(os.open(p, os.O_RDONLY), [memoryview(b)], 8192)
                for p, b in zip(paths, bufs, strict=True)]

    first = jobs()

    def boom(job: ReadJob) -> None:
        raise RuntimeError("verification blew up")

    with pytest.raises(RuntimeError, match="blew up"):
        engine.run(first, boom, max_in_flight=4)
    for job in first:
        os.close(job.fd)
    seen: list[int] = []
    second = jobs()
    engine.run(second, lambda job: seen.append(job.result), max_in_flight=2)  # ring is clean
    for job in second:
        os.close(job.fd)
    assert seen == [8192] * 6
    assert all(bytes(b) == bytes([i]) * 8192 for i, b in enumerate(bufs))


def test_preadv_engine_accepts_an_in_flight_limit(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"x" * 4096)
    buf = bytearray(4096)
    fd = os.open(p, os.O_RDONLY)
    try:
        job = ReadJob(fd, [memoryview(buf)], 4096)
        PreadvEngine().run([job], lambda j: None, max_in_flight=1)
    finally:
        os.close(fd)
    assert job.result == 4096 and bytes(buf) == b"x" * 4096


@uring
@pytest.mark.parametrize("max_inflight", [1, 4])
def test_loader_on_a_pipelined_store_bounds_reads_in_flight(tmp_path: Path,
                                                            max_inflight: int) -> None:
    store, keys, blocks = filled(tmp_path, 40, engine="io_uring")
    seen: list[int] = []
    sizes: list[int] = []
    reads = store.read_path()
    assert isinstance(reads, UringReads)
    original = reads.read_batch_bounded

    def record(ops: list[ReadOp], pool: BufferPool, max_in_flight: int) -> None:
        seen.append(max_in_flight)
        sizes.append(len(ops))
        original(ops, pool, max_in_flight)

    reads.read_batch_bounded = record  # type: ignore[method-assign]
    with StorageLoader(store, max_inflight=max_inflight, block_nbytes=SHAPE.full_nbytes,
                       registry=MetricsRegistry()) as loader:
        assert loader._pipelined
        result = loader.load(keys, timeout=30)
        assert result.store_hits == 40 and result.misses == 0
        for key, block in zip(keys, result.blocks, strict=True):
            assert block is not None and np.array_equal(block.array(), blocks[key])
        result.release()
        assert loader.read_queue.in_flight == 0 and loader.read_queue.blocks == 0
        share = loader.max_share
    # each reader keeps at most its share in the ring, all readers at most max_inflight...
    assert seen and all(n == share for n in seen) and share * loader.workers <= max_inflight
    # ...while its batch runs ahead of the share, so the ring never drains at a hand-off
    assert sum(sizes) == 40 and max(sizes) > share


@pytest.mark.parametrize("oneshot", [True, False])
@pytest.mark.parametrize("nbytes", [0, 4096, 60 << 10, (64 << 10) + 1, 1 << 20])
def test_payload_checksum_is_the_same_digest_on_every_hashing_path(
        monkeypatch: pytest.MonkeyPatch, oneshot: bool, nbytes: int) -> None:
    """One-shot (xxhash >= 4.1), object API (older xxhash) and a streamed, chunked update
    all give the digest stored in block headers: the on-disk format does not depend on it."""
    from dualpath_cli.storage import header

    monkeypatch.setattr(header, "_ONESHOT_DROPS_GIL", oneshot)
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    streamed = xxhash.xxh3_64()
    for start in range(0, nbytes, 256 << 10):
        streamed.update(data[start:start + (256 << 10)])
    want = xxhash.xxh3_64_intdigest(data.tobytes())
    assert streamed.intdigest() == want
    assert payload_checksum(data) == payload_checksum(memoryview(data)) == want


def test_block_buffer_views_share_one_mapping() -> None:
    """The cached iovec targets and checksum view are the array's memory, not copies."""
    buf = BufferPool(0).acquire(HEADER_SIZE + 10_000)
    buf.header[:4] = b"head"
    iov = buf.payload_iov(HEADER_SIZE + 10_000)
    assert len(iov) == 12288  # payload padded to 4 KiB for O_DIRECT
    iov[:3] = b"abc"
    assert bytes(buf.data[:4]) == b"head"
    assert bytes(buf.payload(3)) == b"abc" == bytes(buf.payload_view(3))
    assert len(buf.payload_view(10_000)) == 10_000


@pytest.mark.parametrize(("direct", "want"), [(False, 2), (True, 4)])
def test_loader_defaults_to_one_preadv_reader_per_core_unless_reads_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: bool, want: int) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    store = PosixStore(tmp_path, engine="preadv", direct=direct)
    with StorageLoader(store, max_inflight=32, registry=MetricsRegistry()) as loader:
        assert loader.workers == want


def test_a_file_system_refusing_o_direct_moves_reads_to_the_page_cache_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EINVAL on an O_DIRECT open (a FUSE mount without direct_io): the refused reads are
    read again without it, the store reports it, and from then on reads (and a loader opened
    later) take the page-cache path with its split and pipelined reads."""
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT here")
    store, keys, blocks = filled(tmp_path, 6, direct=True, engine="preadv")
    assert store.direct_active and isinstance(store.read_path(), EngineReads)
    assert not isinstance(store.read_path(), SplitReads)
    real_open = os.open
    refused: list[str] = []

    def no_direct(path: str, flags: int, *args: int) -> int:
        if flags & os.O_DIRECT:
            refused.append(path)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(reads_mod.os, "open", no_direct)
    ops = [ReadOp(k) for k in keys]
    store.read_batch(ops, BufferPool())
    for op, key in zip(ops, keys, strict=True):
        assert op.ok and op.buffer is not None and op.header is not None
        got = op.buffer.payload(op.header.payload_len).view(np.float16)
        assert np.array_equal(got.reshape(2, 16, 1024), blocks[key])
        op.buffer.release()
    assert refused and not store.direct_active
    first_batch = len(refused)  # the batch in flight tried each of its files
    assert isinstance(store.read_path(), PipelinedReads)
    assert store.quarantined() == []
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    with StorageLoader(store, max_inflight=1, registry=MetricsRegistry()) as loader:
        assert loader.overlaps_checksums and loader.workers == 1
        result = loader.load(keys, timeout=30)
        assert result.store_hits == len(keys)
        result.release()
    assert len(refused) == first_batch  # never asked again
