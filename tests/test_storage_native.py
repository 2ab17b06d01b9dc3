"""The optional native read path: builds with the system compiler or falls back cleanly,
reads whole files (errors as -errno), and its digests are exactly xxhash's xxh3-64."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import xxhash

from dualpath_cli.storage import BufferPool
from dualpath_cli.storage import native as native_mod
from dualpath_cli.storage.native import native_reader, native_status


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A cold cache (the build runs again) that is restored for the other tests."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    native_reader.cache_clear()
    yield
    native_reader.cache_clear()


def require_native() -> native_mod.NativeReader:
    reader = native_reader()
    if reader is None:
        pytest.skip(f"native read path unavailable: {native_status()}")
    return reader


def test_reads_whole_files_and_reports_errors_as_errno(tmp_path: Path) -> None:
    reader = require_native()
    big = tmp_path / "big"
    big.write_bytes(bytes(range(256)) * 64)  # 16 KiB
    small = tmp_path / "small"
    small.write_bytes(b"abc")
    pool = BufferPool(0)
    bufs = [pool.acquire(8192) for _ in range(4)]
    paths = [os.fsencode(p) for p in (big, small, tmp_path / "missing", tmp_path)]
    got, digests = reader.read(paths, [b.addr for b in bufs], [b.capacity for b in bufs],
                               digest=True)
    assert digests == [None] * 4  # not block files: nothing hashed
    assert got[0] == 8192 and bytes(bufs[0].data[:8192]) == big.read_bytes()[:8192]
    assert got[1] == 3 and bytes(bufs[1].data[:3]) == b"abc"
    assert got[2] == -errno.ENOENT
    assert got[3] < 0  # a directory cannot be read


@pytest.mark.parametrize("nbytes", [0, 1, 4095, 65 << 10, 1 << 20])
def test_digests_are_xxh3_64(nbytes: int) -> None:
    reader = require_native()
    if not reader.hashes:
        pytest.skip("xxhash exports no usable XXH3 symbol here")
    buf = BufferPool(0).acquire(4096 + nbytes)
    buf.payload(nbytes)[:] = np.random.default_rng(nbytes).integers(0, 256, nbytes,
                                                                     dtype=np.uint8)
    (digest,) = reader.digests([buf.addr + 4096], [nbytes])
    assert digest == xxhash.xxh3_64_intdigest(bytes(buf.payload_view(nbytes)))


def test_read_hashes_each_block_payload_it_read_whole(tmp_path: Path) -> None:
    from dualpath_cli.core.layout import BlockShape, Namespace, prefix_keys
    from dualpath_cli.storage import PosixStore, encode_block

    reader = require_native()
    if not reader.hashes:
        pytest.skip("xxhash exports no usable XXH3 symbol here")
    shape = BlockShape(1, 16, 4096)
    ns = Namespace("m", "layer_major", shape, "fp16")
    store = PosixStore(tmp_path)
    keys = prefix_keys(list(range(32)), ns)
    headers = []
    for i, key in enumerate(keys):
        header, payload = encode_block(key, np.full((1, 16, 2048), i, dtype=np.float16), ns)
        store.put(header, payload)
        headers.append(header)
    cut = store.path(keys[1])
    cut.write_bytes(cut.read_bytes()[:5000])  # the payload it claims was not read whole
    pool = BufferPool(0)
    bufs = [pool.acquire(headers[0].file_nbytes) for _ in keys]
    got, digests = reader.read([os.fsencode(store.path(k)) for k in keys],
                               [b.addr for b in bufs], [b.capacity for b in bufs], digest=True)
    assert got == [headers[0].file_nbytes, 5000]
    assert digests == [headers[0].checksum, None]


def test_builds_into_the_cache_once(fresh: None, tmp_path: Path) -> None:
    if native_reader() is None:
        pytest.skip(f"native read path unavailable: {native_status()}")
    built = list((tmp_path / "cache" / "dualpath").iterdir())
    assert len(built) == 1
    native_reader.cache_clear()
    assert native_reader() is not None  # loaded from the cache, not rebuilt
    assert list((tmp_path / "cache" / "dualpath").iterdir()) == built


def test_no_compiler_falls_back(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert native_reader() is None
    assert native_status().startswith("unavailable")


def test_disabled_by_environment(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUALPATH_NATIVE", "0")
    assert native_reader() is None
    assert "disabled" in native_status()


def test_hasher_thread_digests_every_batch_in_order() -> None:
    """Back-to-back batches (collected at once or after waiting) each give xxh3-64 of their
    own bytes; a second batch before the first is collected is refused."""
    reader = require_native()
    hasher = reader.hasher()
    if hasher is None:
        pytest.skip("no digest symbol")
    rng = np.random.default_rng(3)
    try:
        for round_ in range(200):
            blobs = [rng.integers(0, 256, size=int(n), dtype=np.uint8)
                     for n in rng.integers(0, 70_000, size=1 + round_ % 5)]
            hasher.submit([int(b.ctypes.data) for b in blobs], [b.size for b in blobs])
            assert hasher.busy
            if round_ == 0:
                with pytest.raises(RuntimeError):
                    hasher.submit([int(blobs[0].ctypes.data)], [1])
            assert hasher.wait() == [xxhash.xxh3_64_intdigest(b.tobytes()) for b in blobs]
            assert not hasher.busy
        assert hasher.wait() == []  # nothing outstanding
    finally:
        hasher.close()
        hasher.close()  # idempotent
