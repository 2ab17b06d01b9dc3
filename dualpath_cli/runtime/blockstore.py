"""Minimal StorePort implementations the runtime uses until it is wired to ``storage.KVStore``.

``DirBlockStore`` keeps one file per Full Block (``<root>/<hex key>``): a 16-byte blake2b
checksum followed by the raw layer-major bytes, written to a temp file then renamed. A block
that fails its checksum is moved to ``<root>/quarantine/`` and reported as
``CorruptBlockError`` so the engine recomputes. ``MemoryBlockStore`` is the in-process fake.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import numpy as np

from dualpath_cli.core.layout import BlockKey
from dualpath_cli.storage.errors import ChecksumMismatch

__all__ = ["MemoryBlockStore", "DirBlockStore", "open_store"]

_SUM = 16


class MemoryBlockStore:
    """Full Blocks in a dict (shared by the threads of one process)."""

    def __init__(self, shape: tuple[int, int, int]) -> None:
        self.shape = shape
        self._blocks: dict[bytes, np.ndarray] = {}
        self._lock = threading.Lock()
        self._bad: set[bytes] = set()

    def get(self, key: BlockKey) -> np.ndarray | None:
        with self._lock:
            block = self._blocks.get(key.raw)
            if key.raw in self._bad:
                self._bad.discard(key.raw)
                del self._blocks[key.raw]
                raise ChecksumMismatch(f"memory:{key.hex}", "checksum mismatch")
        return block

    def put(self, key: BlockKey, block: np.ndarray) -> None:
        frozen = np.array(block, dtype=np.uint8, copy=True)
        frozen.flags.writeable = False
        with self._lock:
            self._blocks[key.raw] = frozen

    def contains(self, key: BlockKey) -> bool:
        with self._lock:
            return key.raw in self._blocks

    def corrupt(self, key: BlockKey) -> None:
        """Test hook: flip one byte of a stored block (reads then fail their check)."""
        with self._lock:
            bad = self._blocks[key.raw].copy()
            bad.flat[0] ^= 0xFF
            bad.flags.writeable = False
            self._blocks[key.raw] = bad
            self._bad.add(key.raw)

    def __len__(self) -> int:
        return len(self._blocks)


class DirBlockStore:
    """Checksummed block files under ``root`` (a local disk, tmpfs or a 3FS/NFS mount)."""

    def __init__(self, root: str | Path, shape: tuple[int, int, int]) -> None:
        self.root = Path(root)
        self.shape = shape
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: BlockKey) -> Path:
        return self.root / key.hex

    def get(self, key: BlockKey) -> np.ndarray | None:
        path = self._path(key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        want = int(np.prod(self.shape))
        payload = raw[_SUM:]
        if len(payload) != want or hashlib.blake2b(payload, digest_size=_SUM).digest() != raw[
                :_SUM]:
            qdir = self.root / "quarantine"
            qdir.mkdir(exist_ok=True)
            try:
                os.replace(path, qdir / key.hex)
            except FileNotFoundError:
                pass
            raise ChecksumMismatch(str(path), "checksum or size mismatch")
        return np.frombuffer(payload, dtype=np.uint8).reshape(self.shape)

    def put(self, key: BlockKey, block: np.ndarray) -> None:
        payload = np.ascontiguousarray(block, dtype=np.uint8).tobytes()
        digest = hashlib.blake2b(payload, digest_size=_SUM).digest()
        path = self._path(key)
        tmp = path.with_name(f".{key.hex}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(digest + payload)
        os.replace(tmp, path)

    def contains(self, key: BlockKey) -> bool:
        return self._path(key).exists()


def open_store(spec: dict[str, object], shape: tuple[int, int, int]) -> MemoryBlockStore | (
        DirBlockStore):
    """A store from ``{"kind": "dir", "root": ...}`` or ``{"kind": "memory", "obj": store}``."""
    kind = spec.get("kind", "memory")
    if kind == "dir":
        return DirBlockStore(str(spec["root"]), shape)
    obj = spec.get("obj")
    if isinstance(obj, MemoryBlockStore):
        return obj
    return MemoryBlockStore(shape)
