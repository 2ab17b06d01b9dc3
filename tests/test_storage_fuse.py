"""The POSIX store through a real FUSE mount (bindfs), as 3FS/Lustre/NFS look to it.

CI installs ``bindfs fuse3``; the test skips, saying why, only when bindfs or /dev/fuse is
genuinely unavailable (or mounting is not permitted in this container).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dualpath_cli.core.layout import LAYOUTS, BlockShape, Namespace, full_block_shape, prefix_keys
from dualpath_cli.storage import (
    CODECS,
    HEADER_SIZE,
    ChecksumMismatch,
    PosixStore,
    StorageLoader,
    encode_block,
    get_codec,
    read_one,
)
from dualpath_cli.storage.codecs import numpy_dtype
from dualpath_cli.telemetry import MetricsRegistry

pytestmark = pytest.mark.e2e  # bindfs mounts

SHAPE = BlockShape(n_layers=3, block_tokens=16, bytes_per_token_layer=64)


def _unmount(mnt: Path) -> None:
    for cmd in (["fusermount3", "-u", str(mnt)], ["fusermount", "-u", str(mnt)],
                ["umount", str(mnt)]):
        if shutil.which(cmd[0]) and subprocess.run(cmd, capture_output=True).returncode == 0:
            return


@pytest.fixture()
def fuse_mount(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    if shutil.which("bindfs") is None:
        pytest.skip("bindfs not installed (apt-get install -y bindfs fuse3)")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse not present in this container")
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    done = subprocess.run(["bindfs", str(src), str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"bindfs mount not permitted here: {done.stderr.strip()[:200]}")
    try:
        assert os.path.ismount(mnt)
        yield src, mnt
    finally:
        _unmount(mnt)


@pytest.mark.parametrize("direct", [False, True])
def test_round_trip_every_layout_and_codec_through_fuse(
        fuse_mount: tuple[Path, Path], direct: bool) -> None:
    src, mnt = fuse_mount
    store = PosixStore(mnt / "kv", direct=direct, engine="auto")
    expected = {}
    for layout in LAYOUTS:
        for codec in CODECS:
            ns = Namespace("fuse", layout, SHAPE, codec)
            dtype = codec if get_codec(codec).lossless else "fp16"
            dims = full_block_shape(SHAPE, layout, numpy_dtype(dtype).itemsize)
            block = np.random.default_rng(7).standard_normal(dims).astype(numpy_dtype(dtype))
            key = prefix_keys(list(range(16)), ns)[0]
            store.put(*encode_block(key, block, ns))
            expected[key] = (block, get_codec(codec).lossless)
    # the files really live in the backing directory, written through FUSE
    assert len(list((src / "kv" / "blocks").rglob("*.kv"))) == len(expected)
    with StorageLoader(store, max_inflight=4, registry=MetricsRegistry()) as loader:
        result = loader.load(list(expected), timeout=30)
        assert result.misses == 0
        for key, got in zip(result.keys, result.blocks, strict=True):
            block, lossless = expected[key]
            assert got is not None
            out = got.array()
            if lossless:
                assert out.tobytes() == block.tobytes()
            else:
                ref = block.astype(np.float32)
                assert np.all(np.abs(out.astype(np.float32) - ref)
                              <= 0.0625 * np.abs(ref) + np.abs(ref).max() * 2**-9)
        result.release()


def test_corruption_through_fuse_is_quarantined(fuse_mount: tuple[Path, Path]) -> None:
    src, mnt = fuse_mount
    store = PosixStore(mnt / "kv")
    ns = Namespace("fuse", "layer_major", SHAPE, "fp16")
    key = prefix_keys(list(range(16)), ns)[0]
    store.put(*encode_block(key, np.ones((3, 16, 32), dtype=np.float16), ns))
    backing = src / "kv" / store.path(key).relative_to(mnt / "kv")
    data = bytearray(backing.read_bytes())
    data[HEADER_SIZE + 1] ^= 0x01
    backing.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch):
        read_one(store, key)
    assert read_one(store, key) is None
    assert len(list((src / "kv" / "quarantine").iterdir())) == 1
