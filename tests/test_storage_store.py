"""Stores: round trips for every layout and codec, integrity, capacity, gc, replicas."""

from __future__ import annotations

import os
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from dualpath_cli.core.layout import LAYOUTS, BlockShape, Namespace, full_block_shape, prefix_keys
from dualpath_cli.storage import (
    CODECS,
    HEADER_SIZE,
    BufferPool,
    ChecksumMismatch,
    ForeignHeader,
    KVStore,
    MemoryStore,
    PosixStore,
    ReplicatedStore,
    StorageUsageError,
    TruncatedBlock,
    codec_report,
    encode_block,
    get_codec,
    read_one,
    uring_status,
)
from dualpath_cli.storage.codecs import numpy_dtype
from dualpath_cli.storage.header import file_nbytes
from dualpath_cli.telemetry import MetricsRegistry

SHAPE = BlockShape(n_layers=3, block_tokens=16, bytes_per_token_layer=64)
DTYPE_OF = {"fp16": "fp16", "bf16": "bf16", "fp32": "fp32", "fp8_e4m3": "fp16",
            "fp8_e4m3_layer": "bf16"}


def make_block(ns: Namespace, dtype: str, seed: int = 0) -> np.ndarray:
    dt = numpy_dtype(dtype)
    dims = full_block_shape(ns.shape, ns.layout, dt.itemsize)
    rng = np.random.default_rng(seed)
    data = rng.standard_normal(dims).astype(np.float32)
    # layers with very different magnitudes: per-layer scales must matter
    layer_axis = 0 if ns.layout == "layer_major" else 1
    scale = np.array([0.01, 1.0, 50.0]).reshape([-1 if i == layer_axis else 1 for i in range(3)])
    return (data * scale).astype(dt)


def stores(tmp_path: Path) -> list[KVStore]:
    engines = ["preadv"] + (["io_uring"] if uring_status()[0] else [])
    return ([MemoryStore()] + [PosixStore(tmp_path / f"p-{e}", engine=e) for e in engines]
            + [PosixStore(tmp_path / "direct", direct=True, engine="preadv")])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_every_layout_and_codec(tmp_path: Path, layout: str, codec: str) -> None:
    ns = Namespace("m", layout, SHAPE, codec)
    keys = prefix_keys(list(range(SHAPE.block_tokens * 3)), ns)
    blocks = [make_block(ns, DTYPE_OF[codec], seed=i) for i in range(3)]
    for store in stores(tmp_path):
        for key, block in zip(keys, blocks, strict=True):
            store.put(*encode_block(key, block, ns))
        for key, block in zip(keys, blocks, strict=True):
            got = read_one(store, key)
            assert got is not None
            out = got.array()
            assert out.shape == block.shape and out.dtype == block.dtype
            if get_codec(codec).lossless:
                assert out.tobytes() == block.tobytes()
                assert got.payload.nbytes == block.nbytes
            else:
                ref = block.astype(np.float32)
                err = np.abs(out.astype(np.float32) - ref)
                # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 of each value's scale,
                # plus the subnormal floor of its scale group (and the bf16 output rounding)
                assert np.all(err <= 0.0625 * np.abs(ref) + np.abs(ref).max() * 2**-9 + 1e-6)
            got.release()


@pytest.mark.parametrize("codec", ["fp8_e4m3", "fp8_e4m3_layer"])
def test_fp8_reports_bytes_saved_and_bounded_error(codec: str) -> None:
    ns = Namespace("m", "layer_major", SHAPE, codec)
    block = make_block(ns, "fp16")
    report = codec_report(block, get_codec(codec), "layer_major", SHAPE)
    assert report.raw_bytes == SHAPE.full_nbytes
    assert report.saved_ratio == pytest.approx(0.5, abs=0.01)
    assert report.rel_rms_error < 0.05
    raw = codec_report(block, get_codec("fp16"), "layer_major", SHAPE)
    assert raw.saved_bytes == 0 and raw.max_abs_error == 0.0


def test_per_layer_scales_beat_per_block_scales_on_uneven_layers() -> None:
    # e4m3 spans about 2^-9..448; layers 1e7 apart overflow one shared scale's range
    rng = np.random.default_rng(3)
    block = rng.standard_normal((3, 16, 16)).astype(np.float32)
    block[0] *= 1e-4
    block[2] *= 1e3
    small_layer = block[:1]
    per_block = get_codec("fp8_e4m3").decode(
        get_codec("fp8_e4m3").encode(block, "layer_major"), SHAPE, "layer_major", "fp32")
    per_layer = get_codec("fp8_e4m3_layer").decode(
        get_codec("fp8_e4m3_layer").encode(block, "layer_major"), SHAPE, "layer_major", "fp32")
    err_block = np.abs(per_block[:1] - small_layer).max()
    err_layer = np.abs(per_layer[:1] - small_layer).max()
    assert err_layer < err_block / 10


def test_codec_and_dtype_errors_name_the_value() -> None:
    with pytest.raises(StorageUsageError, match="unknown codec 'zstd'"):
        get_codec("zstd")
    ns = Namespace("m", "layer_major", SHAPE, "fp16")
    key = prefix_keys(list(range(16)), ns)[0]
    with pytest.raises(StorageUsageError, match="does not match namespace"):
        encode_block(key, np.zeros((3, 16, 8), dtype=np.float16), ns)
    ok_shape = np.zeros(full_block_shape(SHAPE, "layer_major", 2), dtype=ml_dtypes.bfloat16)
    with pytest.raises(StorageUsageError, match="codec fp16 stores fp16 blocks"):
        encode_block(key, ok_shape, ns)


def _one(tmp_path: Path) -> tuple[PosixStore, Namespace, list, np.ndarray]:
    ns = Namespace("m", "layer_major", SHAPE, "fp16")
    store = PosixStore(tmp_path / "store")
    keys = prefix_keys(list(range(32)), ns)
    block = make_block(ns, "fp16")
    for key in keys:
        store.put(*encode_block(key, block, ns))
    return store, ns, keys, block


def test_missing_block_is_a_miss_not_an_error(tmp_path: Path) -> None:
    store, ns, keys, _ = _one(tmp_path)
    store.delete(keys[0])
    assert read_one(store, keys[0]) is None
    assert not store.contains(keys[0])


def _corrupt(path: Path, how: str, other: Path | None = None) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip_payload":
        data[HEADER_SIZE + 100] ^= 0x40
    elif how == "flip_header":
        data[40] ^= 0x01
    elif how == "truncate":
        data = data[: HEADER_SIZE + 500]
    elif how == "foreign":
        data[:8] = b"NOTABLOK"
    elif how == "other_key":
        assert other is not None
        data = bytearray(other.read_bytes())
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how,error", [
    ("flip_payload", ChecksumMismatch), ("flip_header", ChecksumMismatch),
    ("truncate", TruncatedBlock), ("foreign", ForeignHeader), ("other_key", ForeignHeader),
])
def test_corruption_is_typed_quarantined_and_never_returned(
        tmp_path: Path, how: str, error: type) -> None:
    store, ns, keys, _ = _one(tmp_path)
    target = store.path(keys[0])
    _corrupt(target, how, other=store.path(keys[1]))
    with pytest.raises(error):
        read_one(store, keys[0])
    assert not target.exists()
    quarantined = store.quarantined()
    assert len(quarantined) == 1 and quarantined[0].startswith(str(tmp_path / "store"))
    assert error.reason in os.path.basename(quarantined[0])
    assert read_one(store, keys[0]) is None  # now a plain miss
    good = read_one(store, keys[1])
    assert good is not None
    good.release()


def test_memory_store_detects_corruption_too() -> None:
    ns = Namespace("m", "layer_major", SHAPE, "fp16")
    store = MemoryStore()
    key = prefix_keys(list(range(16)), ns)[0]
    store.put(*encode_block(key, make_block(ns, "fp16"), ns))
    blob = bytearray(store.raw(key))
    blob[HEADER_SIZE + 3] ^= 0xFF
    store.set_raw(key, bytes(blob))
    with pytest.raises(ChecksumMismatch):
        read_one(store, key)
    assert store.quarantined() and not store.contains(key)


def test_put_is_atomic_and_idempotent(tmp_path: Path) -> None:
    store, ns, keys, block = _one(tmp_path)
    assert store.put(*encode_block(keys[0], block, ns)) == 0  # already there
    leftovers = [p for p in (tmp_path / "store").rglob("*.tmp")]
    assert leftovers == []
    size = store.path(keys[0]).stat().st_size
    assert size % 4096 == 0 and size == file_nbytes(SHAPE.full_nbytes)


def test_fsync_store_writes_readable_blocks(tmp_path: Path) -> None:
    ns = Namespace("m", "layer_major", SHAPE, "fp16")
    store = PosixStore(tmp_path / "s", fsync=True)
    key = prefix_keys(list(range(16)), ns)[0]
    block = make_block(ns, "fp16")
    store.put(*encode_block(key, block, ns))
    got = read_one(store, key)
    assert got is not None and got.array().tobytes() == block.tobytes()
    got.release()


def test_reads_reuse_caller_buffers(tmp_path: Path) -> None:
    store, ns, keys, block = _one(tmp_path)
    pool = BufferPool()
    for _ in range(5):
        got = read_one(store, keys[0], pool)
        assert got is not None
        assert got.buffer.data.ctypes.data % 4096 == 0  # aligned for O_DIRECT
        arr = got.array()
        assert np.shares_memory(arr, got.buffer.data)  # decoded in place, no copy
        got.release()
    assert pool.allocated == 1


def test_capacity_evicts_least_recently_used(tmp_path: Path) -> None:
    ns = Namespace("m", "layer_major", SHAPE, "fp16")
    block_file = file_nbytes(SHAPE.full_nbytes)
    store = PosixStore(tmp_path / "cap", capacity_bytes=3 * block_file)
    keys = prefix_keys(list(range(16 * 5)), ns)
    block = make_block(ns, "fp16")
    for key in keys[:3]:
        store.put(*encode_block(key, block, ns))
    read_one(store, keys[0]).release()  # type: ignore[union-attr]  # keys[0] now recent
    store.put(*encode_block(keys[3], block, ns))
    assert store.contains(keys[0]) and not store.contains(keys[1])
    assert store.usage().bytes <= 3 * block_file


def test_gc_enforces_capacity_removes_temp_files_and_quarantine(tmp_path: Path) -> None:
    store, ns, keys, _ = _one(tmp_path)
    stale = store.path(keys[0]).parent / ".stale.kv.1.2.tmp"
    stale.write_bytes(b"x")
    os.utime(stale, (1, 1))
    _corrupt(store.path(keys[1]), "flip_payload")
    with pytest.raises(ChecksumMismatch):
        read_one(store, keys[1])
    file_size = file_nbytes(SHAPE.full_nbytes)
    report = store.gc(capacity_bytes=file_size, purge_quarantine=True)
    assert report.temp_files == 1 and report.quarantine_files == 1
    assert report.evicted_blocks == 0  # one block left after quarantine: fits
    assert store.usage().blocks == 1 and not stale.exists()


def test_access_counts_persist(tmp_path: Path) -> None:
    store, ns, keys, _ = _one(tmp_path)
    for _ in range(3):
        read_one(store, keys[1]).release()  # type: ignore[union-attr]
    store.flush_access_counts()
    again = PosixStore(tmp_path / "store")
    assert again.access_counts()[keys[1]] == 3


def test_hot_blocks_get_replicas_and_reads_rotate(tmp_path: Path) -> None:
    ns = Namespace("m", "layer_major", SHAPE, "fp16")
    roots = [PosixStore(tmp_path / f"r{i}") for i in range(3)]
    reg = MetricsRegistry()
    store = ReplicatedStore(roots, hot_reads=2, replicas=2, registry=reg)
    key = prefix_keys(list(range(16)), ns)[0]
    block = make_block(ns, "fp16")
    store.put(*encode_block(key, block, ns))
    assert sum(r.contains(key) for r in roots) == 1
    for _ in range(2):
        read_one(store, key).release()  # type: ignore[union-attr]
    assert sum(r.contains(key) for r in roots) == 2
    assert len(store.copies(key)) == 2
    assert sum(reg.value("dualpath_storage_replicated_blocks_total", root=r.name)
               for r in roots) == 1
    for _ in range(4):
        got = read_one(store, key)
        assert got is not None and got.array().tobytes() == block.tobytes()
        got.release()
    assert store.hottest(1) == [(key, 6)]
    # the home copy disappearing is survivable: reads fall back to the replica
    roots[store.home(key)].delete(key)
    for _ in range(2):
        got = read_one(store, key)
        assert got is not None
        got.release()


def test_bad_root_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StorageUsageError, match="cannot create"):
        PosixStore(blocker / "sub")
