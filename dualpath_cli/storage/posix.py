"""A KV store of plain files: one file per Full Block under a two-level fan-out tree.

It only uses POSIX calls that distributed file systems honour (open, pread, rename), so it
works unchanged on a 3FS, Lustre, NFS or any FUSE mount. Writes are atomic (temp file in the
same directory, then rename; optional fsync of file and directory), so a reader sees a whole
block or none. Reads go through one of the read paths of :mod:`~dualpath_cli.storage.reads`
(page cache, O_DIRECT through the engine, io_uring) into caller-owned aligned buffers;
O_DIRECT is used when asked and silently dropped where the file system refuses it (most FUSE
mounts), which :attr:`PosixStore.direct_active` reports.

Bytes held (``dualpath_storage_store_bytes``) are this process's view: the store is scanned
once, lazily, at its first change (or taken from the LRU index when a capacity keeps one),
then tracked by this process's puts, deletes, evictions and quarantines. A read-only opener
never pays that scan; a scanning ``usage()`` seeds the figure, ``gc`` re-bases it.

Layout under ``root``::

    blocks/ab/cd/<32 hex>.kv     a block (header + payload)
    quarantine/<hex>.<reason>.<ns>.kv   blocks found corrupt, never read again
    .dualpath/access.json        persisted read counts (hot blocks, ``storage inspect``)
    .dualpath/removals           the removal generation (one byte appended per removal)

**Removal generation** (:class:`~dualpath_cli.storage.store.CountsRemovals`): every path
here that removes or moves aside a block file (delete, quarantine, capacity eviction, gc), in
whatever process, appends a byte to ``.dualpath/removals`` *after* the file is gone, so the
file's identity, size and times (:meth:`PosixStore.removals`, one ``stat``) change whenever a
block may have disappeared. A prefix lookup then trusts the blocks it found present at an
unchanged generation instead of stat-ing every one again. A file removed by hand (``rm``)
does not move it: a read of such a block fails and the turn's prefill is re-run, as before.
The file is rewritten (a new inode, which also changes the generation) past 1 MiB. If the
byte cannot be appended (a full disk), the file is unlinked instead, which also changes it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from dualpath_cli.atomicio import atomic_write_text
from dualpath_cli.core.layout import BlockKey
from dualpath_cli.storage.buffers import BufferPool
from dualpath_cli.storage.engines import ReadEngine, make_engine
from dualpath_cli.storage.errors import (
    CapacityError,
    StorageUsageError,
    WriteRefused,
)
from dualpath_cli.storage.header import BlockHeader, pack_header, padded
from dualpath_cli.storage.reads import EngineReads, PageCacheReads, UringReads
from dualpath_cli.storage.store import BoundedReads, GcReport, ReadOp, ReadPath, StoreUsage
from dualpath_cli.telemetry.registry import REGISTRY, Gauge, MetricsRegistry

__all__ = ["PosixStore", "BLOCK_SUFFIX", "REMOVALS_FILE"]

log = logging.getLogger(__name__)

BLOCK_SUFFIX = ".kv"
REMOVALS_FILE = ".dualpath/removals"  # under the root: the removal generation
_REMOVALS_ROTATE = 1 << 20  # bytes: the counter file is rewritten past this
_TMP_SUFFIX = ".tmp"
_ZERO_PAD = bytes(4096)


class PosixStore:
    """Block files under ``root``.

    Args:
        root: directory of the store (created if missing).
        direct: open block files with O_DIRECT for reads (bypasses the page cache).
        fsync: fsync each block file and its directory before it becomes visible.
        engine: read engine: ``auto`` (io_uring for O_DIRECT when usable, else preadv),
            ``preadv``, ``io_uring``.
        capacity_bytes: byte limit; a put beyond it evicts least-recently-used blocks.
        queue_depth: io_uring ring depth (reads one thread keeps in flight).
        registry: metrics registry for bytes held and evictions (default: the process-wide
            one), labelled ``root=<root path>``.
    """

    def __init__(self, root: str | os.PathLike[str], *, direct: bool = False,
                 fsync: bool = False, engine: str = "auto", capacity_bytes: int | None = None,
                 queue_depth: int = 64, registry: MetricsRegistry = REGISTRY) -> None:
        self.root = Path(root)
        try:
            (self.root / "blocks").mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StorageUsageError(f"storage root {self.root}: cannot create ({err.strerror})"
                                    ) from None
        if capacity_bytes is not None and capacity_bytes <= 0:
            raise StorageUsageError(f"storage capacity must be positive, got {capacity_bytes}")
        self.direct_requested = direct
        self.fsync = fsync
        self.capacity_bytes = capacity_bytes
        self.engine: ReadEngine = make_engine(engine, queue_depth, direct)
        self._blocks = str(self.root / "blocks")
        self._removals = str(self.root / REMOVALS_FILE)
        self._lock = threading.Lock()
        # the read paths (storage/reads.py); O_DIRECT needs the platform flag
        self._page_cache = PageCacheReads(self._file, self.quarantine, self._count_hits)
        direct = direct and hasattr(os, "O_DIRECT")
        self._engine_reads: EngineReads | None = None
        if self.engine.name == "io_uring":
            self._engine_reads = UringReads(self.engine, direct, self._file, self.quarantine,
                                            self._count_hits)
        elif direct:
            self._engine_reads = EngineReads(self.engine, True, self._file, self.quarantine,
                                             self._count_hits, page_cache=self._page_cache,
                                             on_refused=self._direct_refused)
        self._reads: ReadPath = self._engine_reads or self._page_cache
        self._index: OrderedDict[str, int] | None = None  # hex -> file bytes, LRU order
        self._index_bytes = 0
        self._access: dict[str, int] = {}
        self._flushed: dict[str, int] = {}
        self._registry = registry
        self._bytes: int | None = None  # bytes held as tracked here; None until first known
        self._bytes_lock = threading.Lock()  # one baseline scan at a time
        self._m_bytes: Gauge | None = None  # bound when the figure is first known
        self.m_evicted = registry.counter("dualpath_storage_evicted_blocks_total",
                                          root=self.name)
        if capacity_bytes is not None:
            self._ensure_index()
            self._ensure_bytes()

    # --- identity and paths -----------------------------------------------------------------
    @property
    def name(self) -> str:
        """The root path (metric label)."""
        return str(self.root)

    def path(self, key: BlockKey) -> Path:
        """Where the block of ``key`` lives."""
        return Path(self._file(key))

    def _file(self, key: BlockKey) -> str:
        h = key.raw.hex()  # plain strings: pathlib costs more than a 1 MiB page-cache read
        return f"{self._blocks}/{h[:2]}/{h[2:4]}/{h}{BLOCK_SUFFIX}"

    # --- writes -----------------------------------------------------------------------------
    def contains(self, key: BlockKey) -> bool:
        """True when the block file exists (not verified; reads verify)."""
        return os.access(self._file(key), os.F_OK)  # no exception raised for a miss

    def put(self, header: BlockHeader, payload: np.ndarray | bytes) -> int:
        """Write a block atomically; 0 when the key is already stored (keys are content)."""
        path = self.path(header.key)
        if path.exists():
            self._touch(header.key.hex)
            return 0
        self._ensure_bytes()
        size = header.file_nbytes
        if self.capacity_bytes is not None:
            if size > self.capacity_bytes:
                raise CapacityError(f"block of {size} bytes exceeds store capacity "
                                    f"{self.capacity_bytes} ({self.root})")
            self._make_room(size)
        data = payload if isinstance(payload, bytes) else payload.data.cast("B")
        pad = padded(header.payload_len) - header.payload_len
        parts = [pack_header(header), data, _ZERO_PAD[:pad]]
        tmp = path.parent / f".{path.name}.{os.getpid()}.{threading.get_ident()}{_TMP_SUFFIX}"
        try:
            try:
                self._write(tmp, parts)
            except FileNotFoundError:  # its directory does not exist yet
                path.parent.mkdir(parents=True, exist_ok=True)
                self._write(tmp, parts)
            os.replace(tmp, path)
        except OSError as err:  # full, read-only, failing: no temp file may stay behind
            _unlink_quiet(tmp)
            raise WriteRefused(str(path), err.errno, err.strerror) from None
        if self.fsync:
            _fsync_dir(path.parent)
        h = header.key.hex
        with self._lock:
            index = self._index
            if index is None or h not in index:  # a racing put of the same key counts once
                if index is not None:
                    index[h] = size
                    self._index_bytes += size
                self._add_bytes(size)
        return size

    def _write(self, tmp: Path, parts: list[bytes | memoryview]) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            total = sum(len(p) for p in parts)
            written = os.writev(fd, parts)
            if written != total:  # rare: finish with plain writes
                blob = b"".join(bytes(p) for p in parts)
                while written < total:
                    written += os.write(fd, blob[written:])
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    # --- reads ------------------------------------------------------------------------------
    def read_path(self) -> ReadPath:
        """The read path :meth:`read_batch` uses now (:mod:`~dualpath_cli.storage.reads`):
        page-cache reads, O_DIRECT reads through the engine, or io_uring reads. A loader
        drives its optional capabilities (split, pipelined, bounded reads) directly."""
        return self._reads

    def read_batch(self, ops: list[ReadOp], pool: BufferPool,
                   max_in_flight: int | None = None) -> None:
        """Read ``ops``, at most ``max_in_flight`` reads in the kernel at once where the path
        bounds them (io_uring); corrupt blocks are quarantined, never returned."""
        reads = self._reads
        if max_in_flight is not None and isinstance(reads, BoundedReads):
            reads.read_batch_bounded(ops, pool, max_in_flight)
        else:
            reads.read_batch(ops, pool)

    @property
    def direct_active(self) -> bool:
        """True while reads use O_DIRECT (False once the file system refused it)."""
        return self._engine_reads is not None and self._engine_reads.direct

    def _direct_refused(self) -> None:
        """The file system refused O_DIRECT: preadv reads take the page-cache path now."""
        if self.engine.name == "preadv":
            self._reads = self._page_cache

    def _count_hits(self, ops: list[ReadOp]) -> None:
        """Access counts and LRU order of the blocks read."""
        hits = [op.key.hex for op in ops if op.header is not None and not op.probe]
        if hits:
            with self._lock:
                index = self._index
                access = self._access
                for h in hits:
                    access[h] = access.get(h, 0) + 1
                    if index is not None and h in index:
                        index.move_to_end(h)

    def verify(self, key: BlockKey) -> BlockHeader | None:
        """Read and check one block; None if missing; raises (after quarantine) if corrupt."""
        op = ReadOp(key)
        self.read_batch([op], BufferPool(0))
        if op.error is not None:
            raise op.error
        if op.buffer is not None:
            op.buffer.release()
        return op.header

    # --- removal, quarantine, capacity ------------------------------------------------------
    def delete(self, key: BlockKey) -> bool:
        """Remove a block file."""
        self._ensure_bytes()
        path = self.path(key)
        try:
            size = os.stat(path).st_size
            os.unlink(path)
        except FileNotFoundError:
            return False
        self._bump_removals()
        self._forget(key.hex, size)
        return True

    def quarantine(self, key: BlockKey, reason: str) -> str | None:
        """Move a block file to ``quarantine/`` (kept for post-mortems, never read)."""
        self._ensure_bytes()
        qdir = self.root / "quarantine"
        qdir.mkdir(exist_ok=True)
        dest = qdir / f"{key.hex}.{reason}.{time.time_ns()}{BLOCK_SUFFIX}"
        path = self.path(key)
        try:
            size = os.stat(path).st_size
            os.replace(path, dest)
        except FileNotFoundError:
            return None
        self._bump_removals()
        self._forget(key.hex, size)
        return str(dest)

    def quarantined(self) -> list[str]:
        """Files in quarantine."""
        qdir = self.root / "quarantine"
        return sorted(str(p) for p in qdir.iterdir()) if qdir.is_dir() else []

    # --- removal generation ---------------------------------------------------------------
    def removals(self) -> tuple[int, int, int, int] | None:
        """The removal generation (see the module docstring): the counter file's inode,
        size, mtime and ctime; one ``stat``. Creates the file when missing (a new inode:
        a new generation); ``None`` when it cannot be read or created (read-only root)."""
        try:
            st = os.stat(self._removals)
        except FileNotFoundError:
            try:
                os.makedirs(os.path.dirname(self._removals), exist_ok=True)
                os.close(os.open(self._removals, os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                                 0o644))
                st = os.stat(self._removals)
            except OSError:
                return None
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

    def _bump_removals(self) -> None:
        """A block file is gone: move the generation (always *after* the removal, so a
        reader that saw the block present read an older generation)."""
        try:
            try:
                fd = os.open(self._removals, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            except FileNotFoundError:  # no .dualpath yet
                os.makedirs(os.path.dirname(self._removals), exist_ok=True)
                fd = os.open(self._removals, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                if os.write(fd, b".") != 1:
                    raise OSError("short write")
                big = os.fstat(fd).st_size > _REMOVALS_ROTATE
            finally:
                os.close(fd)
            if big:  # a new, empty file under the name: another inode, another generation
                atomic_write_text(Path(self._removals), "", fsync=False)
        except OSError as err:
            try:  # a missing file is a new generation too (readers recreate it)
                os.unlink(self._removals)
            except FileNotFoundError:
                pass
            except OSError as again:
                log.warning("%s: a block was removed but the removal generation could not "
                            "be moved (%s; %s): prefix lookups may trust it until a read "
                            "fails", self.root, err, again)

    def _forget(self, h: str, size: int) -> None:
        """A block file of ``size`` bytes is gone (deleted or quarantined)."""
        with self._lock:
            if self._index is not None and h in self._index:
                self._index_bytes -= self._index.pop(h)
            self._add_bytes(-size)

    # --- bytes held (metric) ----------------------------------------------------------------
    def _ensure_bytes(self) -> None:
        """Know the bytes held before the first change: from the index, else one scan."""
        if self._bytes is not None:
            return
        with self._bytes_lock:
            if self._bytes is not None:
                return
            with self._lock:
                known = self._index_bytes if self._index is not None else None
            if known is None:
                known = sum(st.st_size for _, st in self._scan())
            with self._lock:
                self._set_bytes(known)

    def _set_bytes(self, value: int) -> None:
        """Replace the figure and publish it (lock held)."""
        self._bytes = value
        if self._m_bytes is None:
            self._m_bytes = self._registry.gauge("dualpath_storage_store_bytes", root=self.name)
        self._m_bytes.set(value)

    def _add_bytes(self, delta: int) -> None:
        """Track a change once the figure is known (lock held)."""
        if self._bytes is not None:
            self._set_bytes(max(0, self._bytes + delta))

    def _touch(self, h: str) -> None:
        with self._lock:
            if self._index is not None and h in self._index:
                self._index.move_to_end(h)

    def _scan(self) -> Iterator[tuple[str, os.stat_result]]:
        base = self.root / "blocks"
        for top in _subdirs(base):
            for mid in _subdirs(top):
                for entry in os.scandir(mid):
                    if entry.name.endswith(BLOCK_SUFFIX) and not entry.name.startswith("."):
                        try:
                            yield entry.name[:-len(BLOCK_SUFFIX)], entry.stat()
                        except FileNotFoundError:
                            continue

    def _ensure_index(self) -> OrderedDict[str, int]:
        with self._lock:
            if self._index is None:
                found = sorted(self._scan(), key=lambda item: max(item[1].st_atime_ns,
                                                                  item[1].st_mtime_ns))
                self._index = OrderedDict((h, st.st_size) for h, st in found)
                self._index_bytes = sum(self._index.values())
            return self._index

    def _make_room(self, size: int) -> None:
        assert self.capacity_bytes is not None
        self._evict_to(self.capacity_bytes - size)

    def _evict_to(self, limit: int) -> tuple[int, int]:
        index = self._ensure_index()
        blocks = freed = 0
        try:
            while True:
                with self._lock:
                    if self._index_bytes <= limit or not index:
                        break
                    h, size = index.popitem(last=False)
                    self._index_bytes -= size
                    self._add_bytes(-size)  # gone either way: evicted now or removed elsewhere
                try:
                    os.unlink(self.path(BlockKey.from_hex(h)))
                    blocks, freed = blocks + 1, freed + size
                    self.m_evicted.inc()
                except FileNotFoundError:
                    pass
        finally:
            if blocks:  # once per batch, after its unlinks (even one that failed midway)
                self._bump_removals()
        return blocks, freed

    def keys(self) -> Iterator[BlockKey]:
        """Every stored key."""
        for h, _ in self._scan():
            try:
                yield BlockKey.from_hex(h)
            except ValueError:
                continue

    def usage(self) -> StoreUsage:
        """Blocks and bytes (from the LRU index when kept, else a scan)."""
        with self._lock:
            if self._index is not None:
                return StoreUsage(len(self._index), self._index_bytes, self.capacity_bytes)
        sizes = [st.st_size for _, st in self._scan()]
        if self._bytes is None:
            with self._bytes_lock:  # seed only: while unknown, no change is in flight
                with self._lock:
                    if self._bytes is None:
                        self._set_bytes(sum(sizes))
        return StoreUsage(len(sizes), sum(sizes), self.capacity_bytes)

    def gc(self, capacity_bytes: int | None = None, purge_quarantine: bool = False,
           tmp_max_age_s: float = 600.0) -> GcReport:
        """Evict LRU blocks to ``capacity_bytes`` (default: the store's), remove temp files
        older than ``tmp_max_age_s`` left by crashed writers, optionally empty quarantine."""
        report = GcReport()
        now = time.time()
        for top in _subdirs(self.root / "blocks"):
            for mid in _subdirs(top):
                for entry in os.scandir(mid):
                    if entry.name.endswith(_TMP_SUFFIX):
                        try:
                            if now - entry.stat().st_mtime > tmp_max_age_s:
                                os.unlink(entry.path)
                                report.temp_files += 1
                        except FileNotFoundError:
                            continue
        limit = capacity_bytes if capacity_bytes is not None else self.capacity_bytes
        if limit is not None:
            with self._bytes_lock:
                with self._lock:
                    self._index = None  # rescan: other processes may have written
                self._ensure_index()
                with self._lock:  # re-base on the fresh scan, as the LRU index does
                    self._set_bytes(self._index_bytes)
            report.evicted_blocks, report.evicted_bytes = self._evict_to(limit)
        if purge_quarantine:
            qdir = self.root / "quarantine"
            if qdir.is_dir():
                report.quarantine_files = sum(1 for _ in qdir.iterdir())
                shutil.rmtree(qdir, ignore_errors=True)
        return report

    # --- access counts ----------------------------------------------------------------------
    def access_counts(self) -> dict[BlockKey, int]:
        """Reads per block: persisted counts plus this process's."""
        merged = dict(self._load_counts())
        with self._lock:
            for h, n in self._access.items():
                merged[h] = merged.get(h, 0) + n - self._flushed.get(h, 0)
        return {BlockKey.from_hex(h): n for h, n in merged.items()}

    def flush_access_counts(self) -> None:
        """Merge this process's read counts into ``.dualpath/access.json`` (atomic)."""
        with self._lock:
            delta = {h: n - self._flushed.get(h, 0) for h, n in self._access.items()
                     if n != self._flushed.get(h, 0)}
            self._flushed = dict(self._access)
        if not delta:
            return
        counts = self._load_counts()
        for h, n in delta.items():
            counts[h] = counts.get(h, 0) + n
        meta = self.root / ".dualpath"
        meta.mkdir(exist_ok=True)
        # a unique temp file per writer: engines of one process share a root (in-process
        # cluster) and used to race on a pid-named temp file
        atomic_write_text(meta / "access.json", json.dumps(counts), fsync=False)

    def _load_counts(self) -> dict[str, int]:
        try:
            data = json.loads((self.root / ".dualpath" / "access.json").read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _subdirs(path: Path | str) -> list[str]:
    try:
        return [e.path for e in os.scandir(path) if e.is_dir() and len(e.name) == 2]
    except FileNotFoundError:
        return []


def _unlink_quiet(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
