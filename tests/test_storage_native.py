"""The optional native read path: built at install or with the system compiler at run time
(keyed by host, rebuilt once when it fails to load), or a fallback an operator is told about;
it reads whole files (errors as -errno), and its digests are exactly xxhash's xxh3-64.

With ``DUALPATH_REQUIRE_NATIVE=1`` (CI, which installs a compiler) a missing native path
fails the suite instead of being skipped."""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import subprocess
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
    """A cold cache and no library from the install (the runtime build runs again), and the
    fallback warning not given yet; restored for the other tests."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(native_mod, "installed_library", lambda: None)
    monkeypatch.setattr(native_mod, "_warned", False)
    native_reader.cache_clear()
    yield
    native_reader.cache_clear()


def cached(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "dualpath").iterdir())


def compiler() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    return cc


@pytest.mark.skipif(os.environ.get("DUALPATH_REQUIRE_NATIVE") != "1",
                    reason="DUALPATH_REQUIRE_NATIVE=1 (CI) makes the native path required")
def test_the_native_path_is_required_here() -> None:
    """CI installs a compiler before ``pip install -e .``: the library must have been built
    at install and must hash, or CI would silently test only the Python fallback."""
    info = native_mod.native_info()
    assert info.available and info.digests, info.status
    assert info.origin == "installed", f"not built at install: {info.status}"


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
    built = cached(tmp_path)
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    native_reader.cache_clear()
    assert native_reader() is not None  # loaded from the cache, not rebuilt
    assert cached(tmp_path) == built and built[0].stat().st_mtime_ns == stamp


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


def test_an_installed_library_is_used_when_present() -> None:
    path = native_mod.installed_library()
    if path is None:
        pytest.skip("not built at install here (no compiler at install time)")
    info = native_mod.native_info()
    assert info.origin == "installed" and info.path == str(path), info.status
    assert "built at install" in info.status


def test_the_abi_of_the_source_is_this_modules() -> None:
    source = (Path(native_mod.__file__).parent / "_native" / "reader.c").read_text()
    match = re.search(r"#define DP_ABI (\d+)", source)
    assert match is not None and int(match.group(1)) == native_mod._ABI


def test_an_installed_library_of_another_abi_is_not_used(fresh: None, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "_reader.so"
    source = Path(native_mod.__file__).parent / "_native" / "reader.c"
    subprocess.run([compiler(), "-O2", "-shared", "-fPIC", "-pthread", "-DDP_ABI=1", "-o",
                    str(stale), str(source)], check=True, capture_output=True)
    monkeypatch.setattr(native_mod, "installed_library", lambda: stale)
    assert native_reader() is not None
    info = native_mod.native_info()
    assert info.origin == "runtime-build" and info.path != str(stale)


def test_the_cache_key_names_platform_architecture_libc_and_python_abi(fresh: None,
                                                                      tmp_path: Path) -> None:
    import platform
    import sysconfig

    key = native_mod.cache_key()
    libc, version = platform.libc_ver()
    for part in (sysconfig.get_platform(), platform.machine(), f"{libc}-{version}",
                 str(sysconfig.get_config_var("SOABI"))):
        assert part in key
    if native_reader() is None:
        pytest.skip(f"native read path unavailable: {native_status()}")
    (built,) = cached(tmp_path)
    assert platform.machine() in built.name and libc in built.name


def test_a_cached_library_that_fails_to_load_is_rebuilt_once(fresh: None,
                                                              tmp_path: Path) -> None:
    """A truncated library (or another host's, under a shared home) in the cache does not
    turn the native path off for good: it is rebuilt once."""
    compiler()
    lib = native_mod._library_path()
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\x7fELF" + bytes(1000))  # truncated: never loaded in this process
    assert native_reader() is not None, native_status()
    assert cached(tmp_path) == [lib] and lib.stat().st_size > 1004
    assert native_mod.native_info().origin == "runtime-build"


def test_falling_back_to_python_is_warned_once_and_reported(
        fresh: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with caplog.at_level(logging.WARNING, logger=native_mod.__name__):
        assert native_reader() is None
        native_reader.cache_clear()
        assert native_reader() is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Python" in warnings[0].getMessage()
    info = native_mod.native_info()
    assert not info.available and info.origin is None
    assert "no C compiler" in info.status and "not built at install" in info.status
    assert info.as_dict()["available"] is False


def test_disabling_on_purpose_is_not_warned(fresh: None, monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("DUALPATH_NATIVE", "0")
    with caplog.at_level(logging.WARNING, logger=native_mod.__name__):
        assert native_reader() is None
    assert not caplog.records
