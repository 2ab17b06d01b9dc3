"""Throughput measurements of the loader (and of fio on the same files) for benchmarks.

Used by ``dualpath storage bench`` and by ``bench/storage.py``. A data set is a store whose
block *files* are exactly ``block_size`` bytes (4 KiB header + payload), so fio reading whole
files with ``bs=block_size`` moves the same bytes the loader does. The loader is driven the
way an engine drives it: batches submitted as tickets, blocks released as they complete so
the buffers are reused, checksums verified on every read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dualpath_cli.core.layout import BlockShape, Namespace, prefix_keys
from dualpath_cli.storage.block import encode_block
from dualpath_cli.storage.errors import StorageUsageError
from dualpath_cli.storage.header import HEADER_SIZE
from dualpath_cli.storage.loader import StorageLoader
from dualpath_cli.storage.posix import PosixStore
from dualpath_cli.storage.tickets import LoadResult
from dualpath_cli.telemetry.registry import MetricsRegistry

__all__ = ["Dataset", "LoaderRun", "make_dataset", "loader_run", "loader_gbps", "shaped_mbps",
           "fio_gbps", "fio_available", "warm_page_cache", "ticket_layout",
           "verified_ceiling_gbps"]

_TOKENS = 64


@dataclass(frozen=True, slots=True)
class Dataset:
    """Block files of one size under ``root`` and their keys."""

    root: Path
    block_size: int
    keys: list
    namespace: Namespace

    @property
    def nbytes(self) -> int:
        """Bytes of all block files."""
        return self.block_size * len(self.keys)


def make_dataset(root: Path, block_size: int, total_bytes: int, seed: int = 0) -> Dataset:
    """Write ``total_bytes`` of ``block_size``-byte block files (fp16 random payloads)."""
    payload = block_size - HEADER_SIZE
    if payload <= 0 or payload % (_TOKENS * 2):
        raise StorageUsageError(f"bench block size {block_size} must exceed the 4 KiB header "
                                f"by a multiple of {_TOKENS * 2} bytes")
    shape = BlockShape(1, _TOKENS, payload // _TOKENS)
    ns = Namespace("bench", "layer_major", shape, "fp16")
    count = max(1, total_bytes // block_size)
    tokens = np.arange(count * _TOKENS, dtype=np.uint32) + seed * 1_000_003
    keys = prefix_keys(tokens.tolist(), ns)
    store = PosixStore(root)
    rng = np.random.default_rng(seed)
    block = rng.standard_normal((1, _TOKENS, payload // _TOKENS // 2)).astype(np.float16)
    for i, key in enumerate(keys):
        block[0, 0, 0] = i  # distinct content per block
        store.put(*encode_block(key, block, ns))
    return Dataset(Path(root), block_size, keys, ns)


def _drive(loader: StorageLoader, keys: list, chunk: int, window: int) -> float:
    """Read ``keys`` through ``loader`` in tickets of ``chunk`` blocks, at most ``window``
    tickets outstanding, releasing blocks on completion; returns seconds elapsed."""
    slots = threading.Semaphore(window)
    done = threading.Event()
    remaining = [0]
    lock = threading.Lock()
    failures: list[int] = []
    chunks = [keys[i:i + chunk] for i in range(0, len(keys), chunk)]
    remaining[0] = len(chunks)

    def finished(result: LoadResult) -> None:
        if result.misses:
            failures.append(result.misses)
        result.release()
        slots.release()
        with lock:
            remaining[0] -= 1
            if remaining[0] == 0:
                done.set()

    start = time.perf_counter()
    for part in chunks:
        slots.acquire()
        loader.submit(part).add_done_callback(finished)
    done.wait()
    elapsed = time.perf_counter() - start
    if failures:
        raise RuntimeError(f"bench read {sum(failures)} misses; the data set is damaged")
    return elapsed


@dataclass(frozen=True, slots=True)
class LoaderRun:
    """One loader measurement and the I/O layout it used, so fio can be run the same way:
    ``workers`` threads, each with at most ``per_worker`` reads in flight on ``engine``."""

    gbps: float
    engine: str
    workers: int
    per_worker: int
    overlap: bool = False  # checksums hashed on a helper thread while the next batch is read

    @property
    def fio_layout(self) -> tuple[str, int, int]:
        """(ioengine, numjobs, iodepth) for fio: psync threads for preadv (one read each in
        flight), io_uring rings of the reader's share for io_uring."""
        if self.engine == "io_uring":
            return "io_uring", self.workers, self.per_worker
        return "psync", self.workers, 1


def ticket_layout(block_size: int, queue_depth: int) -> tuple[int, int]:
    """(blocks per ticket, tickets outstanding) for a bench run.

    An engine asks for a whole cached prefix at once: tickets of about 8 MiB (at least one
    block), and holds a ticket's blocks until all of them landed. Enough tickets stay
    outstanding that at least ``queue_depth`` blocks (and never fewer than four tickets) are
    queued, so the loader can keep its queue depth. Tickets do not grow with the queue
    depth: a 128 MiB ticket (32 blocks of 4 MiB) would make the consumer hold 128 MiB of
    buffers, far beyond the CPU caches, which no engine reading a prefix needs.
    """
    chunk = max(1, (8 << 20) // block_size)
    return chunk, max(4, -(-queue_depth // chunk) + 1)


def loader_gbps(data: Dataset, queue_depth: int, *, direct: bool, engine: str = "auto",
                min_seconds: float = 0.5, workers: int | None = None,
                progress: Callable[[], None] | None = None) -> tuple[float, str]:
    """Loader throughput in GB/s (1e9 bytes/s) over the data set; returns (gbps, engine)."""
    run = loader_run(data, queue_depth, direct=direct, engine=engine, min_seconds=min_seconds,
                     workers=workers, progress=progress)
    return run.gbps, run.engine


def loader_run(data: Dataset, queue_depth: int, *, direct: bool, engine: str = "auto",
               min_seconds: float = 0.5, workers: int | None = None,
               progress: Callable[[], None] | None = None) -> LoaderRun:
    """Loader throughput over the data set and the thread/depth layout it used."""
    store = PosixStore(data.root, direct=direct, engine=engine, queue_depth=max(queue_depth, 8))
    with StorageLoader(store, max_inflight=queue_depth, registry=MetricsRegistry(),
                       block_nbytes=data.block_size, workers=workers) as loader:
        chunk, window = ticket_layout(data.block_size, queue_depth)
        total_bytes, elapsed = 0, 0.0
        # warm-up, not measured: enough tickets that the buffer pool holds its steady-state
        # working set (a fresh buffer costs a page fault and a zeroing pass per 4 KiB page);
        # four windows of tickets cover it, a whole pass of the data set is not needed
        _drive(loader, data.keys[:4 * chunk * window], chunk, window)
        while True:  # at least one full pass
            elapsed += _drive(loader, data.keys, chunk, window)
            total_bytes += data.nbytes
            if progress:
                progress()
            if elapsed >= min_seconds:
                break
        # preadv readers keep one read each in flight; io_uring readers keep their share
        per_worker = loader.max_share if store.engine.name == "io_uring" else 1
        return LoaderRun(total_bytes / elapsed / 1e9, store.engine.name, loader.workers,
                         per_worker, loader.overlaps_checksums)


def shaped_mbps(data: Dataset, target_bps: float, seconds: float = 1.0,
                queue_depth: int = 8) -> float:
    """Measured MB/s (1e6) when the loader is shaped to ``target_bps`` bytes/s."""
    store = PosixStore(data.root)
    count = max(queue_depth * 4, int(target_bps * seconds / data.block_size))
    keys = (data.keys * (count // len(data.keys) + 1))[:count]
    with StorageLoader(store, max_inflight=queue_depth, shaping_bps=target_bps,
                       registry=MetricsRegistry(), block_nbytes=data.block_size) as loader:
        elapsed = _drive(loader, keys, queue_depth, 4)
    return count * data.block_size / elapsed / 1e6


class DiskRequests:
    """Read requests the block device under a path completed, from ``/proc/diskstats``.

    Why: an O_DIRECT read reaches the device as one or more requests, and on a virtio disk
    the rate follows the request count (each costs about the same time), so average KiB per
    request explains an O_DIRECT row: a 1 MiB read split in two (its buffer's pages
    scattered: more than the device's 254 segments) or merged with a neighbour's.
    ``read()`` is None where the device cannot be found (not Linux, an overlay, a FUSE fs).
    """

    stats_path = "/proc/diskstats"

    def __init__(self, path: Path) -> None:
        dev = os.stat(path).st_dev
        self._id = (os.major(dev), os.minor(dev))

    def read(self) -> tuple[int, int] | None:
        """(read requests completed, bytes read) so far, or None."""
        try:
            with open(self.stats_path) as fh:
                for line in fh:
                    fields = line.split()
                    if (int(fields[0]), int(fields[1])) == self._id:
                        return int(fields[3]), int(fields[5]) * 512
        except (OSError, ValueError, IndexError):
            return None
        return None

    def kib_per_request(self, before: tuple[int, int] | None) -> float | None:
        """Average KiB per read request since ``before`` (a :meth:`read`), or None."""
        after = self.read()
        if before is None or after is None or after[0] <= before[0]:
            return None
        return (after[1] - before[1]) / (after[0] - before[0]) / 1024


def fio_available() -> str | None:
    """Path of the fio binary, or None."""
    return shutil.which("fio")


def fio_gbps(data: Dataset, queue_depth: int, *, direct: bool, min_seconds: float = 0.5,
             ioengine: str = "io_uring", numjobs: int = 1) -> float:
    """fio's throughput in GB/s reading every block file of the data set whole.

    ``numjobs`` threads each keep ``queue_depth`` reads in flight (psync: one), each opening,
    reading and closing every block file in turn, as the loader does.
    """
    fio = fio_available()
    if fio is None:
        raise StorageUsageError("fio is not installed (apt-get install -y fio)")
    cmd = [fio, "--name=dualpath", f"--opendir={data.root / 'blocks'}", "--rw=read",
           f"--bs={data.block_size}", f"--ioengine={ioengine}", f"--iodepth={queue_depth}",
           f"--numjobs={numjobs}", "--group_reporting",
           f"--direct={int(direct)}", "--invalidate=0", "--thread", "--time_based=1",
           f"--runtime={max(1, round(min_seconds))}", "--output-format=json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"fio failed: {out.stderr.strip()[:300]}")
    text = out.stdout[out.stdout.index("{"):]
    job = json.loads(text)["jobs"][0]["read"]
    return float(job["bw_bytes"]) / 1e9


def verified_ceiling_gbps(data: Dataset, workers: int, *, overlap: bool,
                          min_seconds: float = 0.5, batch_bytes: int = 8 << 20) -> float | None:
    """The fastest a *verifying* page-cache reader can go here, in GB/s; None without the
    native read path.

    ``workers`` threads each read their share of the block files whole, in batches of about
    ``batch_bytes``, through the native read path (one GIL-free C call per batch, no Python per
    block) and hash every payload with xxh3-64: inline right after its read, or with
    ``overlap`` on a C hashing thread of its own while the next batch is read, the two
    strategies the loader uses. Nothing is checked or delivered, so this is the copy plus the
    checksum alone: the bound that any loader verifying every block meets on this host, to
    set beside fio (which copies and verifies nothing).
    """
    from dualpath_cli.storage.native import native_reader

    native = native_reader()
    if native is None or not native.hashes:
        return None
    store = PosixStore(data.root)
    paths = [os.fsencode(store.path(key)) for key in data.keys]
    per_batch = max(1, batch_bytes // data.block_size)
    payload = data.block_size - HEADER_SIZE
    moved = [0] * workers

    stop = threading.Event()  # set when the caller leaves early (a signal, Ctrl-C)

    def reader(index: int, deadline: float) -> None:
        mine = paths[index::workers] or paths
        batches = [mine[i:i + per_batch] for i in range(0, len(mine), per_batch)]
        slots = 2 if overlap else 1  # overlap: read one buffer set while the other is hashed
        bufs = [np.zeros((per_batch, data.block_size), dtype=np.uint8) for _ in range(slots)]
        addrs = [[int(b.ctypes.data) + i * data.block_size for i in range(per_batch)]
                 for b in bufs]
        hasher = native.hasher() if overlap else None
        try:
            turn = 0
            while True:  # at least one whole pass: a thread started late still measures
                for batch in batches:
                    if stop.is_set():
                        return
                    slot = addrs[turn % slots][:len(batch)]
                    nread, _ = native.read(batch, slot, [data.block_size] * len(batch),
                                           digest=hasher is None)
                    if hasher is not None:
                        hasher.wait()
                        hasher.submit([a + HEADER_SIZE for a in slot], [payload] * len(batch))
                    moved[index] += sum(nread)
                    turn += 1
                if time.perf_counter() >= deadline:
                    break
            if hasher is not None:
                hasher.wait()
        finally:
            if hasher is not None:
                hasher.close()

    start = time.perf_counter()
    threads = [threading.Thread(target=reader, args=(i, start + min_seconds))
               for i in range(workers)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    finally:  # interrupted: the readers stop at their next batch instead of the deadline,
        stop.set()  # which would hold the process (non-daemon threads) for --seconds
        for t in threads:
            t.join()
    return sum(moved) / (time.perf_counter() - start) / 1e9


def warm_page_cache(data: Dataset) -> None:
    """Read every block file once so page-cache rows measure DRAM, not the disk."""
    store = PosixStore(data.root, engine="preadv")
    for key in data.keys:
        with open(store.path(key), "rb") as fh:
            while fh.read(1 << 22):
                pass
