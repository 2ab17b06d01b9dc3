"""Huge-page slabs for large read buffers, and the bench's per-request disk counters: the two
halves of why O_DIRECT block reads reach the device as one request each."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dualpath_cli.storage import BufferPool
from dualpath_cli.storage.benchmark import DiskRequests


def test_large_buffers_are_carved_from_aligned_slabs() -> None:
    pool = BufferPool()
    size = 1 << 20
    bufs = [pool.acquire(size) for _ in range(10)]
    addrs = [b.addr for b in bufs]
    assert addrs[0] % (2 << 20) == 0  # a slab starts on a huge-page boundary
    assert addrs[1:8] == [addrs[0] + i * size for i in range(1, 8)]  # eight to a slab
    assert addrs[8] % (2 << 20) == 0 and addrs[9] == addrs[8] + size  # then a new slab
    for i, buf in enumerate(bufs):  # each buffer is its own memory
        buf.data[:] = i
    assert [int(b.data[0]) for b in bufs] == list(range(10))
    assert all(int(b.data[-1]) == i for i, b in enumerate(bufs))
    bufs[3].release()
    again = pool.acquire(size)
    assert again is bufs[3]  # reuse before carving more
    assert pool.allocated == 10


def test_a_dropped_slab_buffer_gives_its_pages_back() -> None:
    pool = BufferPool(max_free_bytes=1 << 20)  # keeps one 1 MiB buffer, drops the rest
    kept, dropped = pool.acquire(1 << 20), pool.acquire(1 << 20)
    kept.data[:] = 7
    dropped.data[:] = 9
    kept.release()  # back to the free list
    dropped.release()  # over the cap: dropped, its pages returned to the kernel
    assert pool.free_bytes == 1 << 20
    assert not dropped.data.any()  # private anonymous pages read as zeros once returned
    assert pool.acquire(1 << 20) is kept and int(kept.data[-1]) == 7


def test_small_buffers_keep_a_mapping_each() -> None:
    pool = BufferPool()
    a, b = pool.acquire(64 << 10), pool.acquire(64 << 10)
    assert a.addr % 4096 == 0 and b.addr % 4096 == 0
    assert a._map is not b._map


def test_slabs_are_advised_for_huge_pages_where_the_kernel_offers_them() -> None:
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        pytest.skip("no transparent huge pages here")
    if "[never]" in mode:
        pytest.skip("transparent huge pages are off here")
    buf = BufferPool().acquire(1 << 20)
    start = f"{buf.addr:x}"
    eligible = None
    with open("/proc/self/smaps") as fh:
        inside = False
        for line in fh:
            if "-" in line.split()[0] and not line[0].isupper():
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                inside = lo <= buf.addr < hi
            elif inside and line.startswith("THPeligible:"):
                eligible = line.split()[1]
                break
    if eligible is None:
        pytest.skip(f"smaps has no THPeligible for {start}")
    assert eligible == "1"


def test_disk_requests_average_kib_per_request(tmp_path: Path) -> None:
    dev = os.stat(tmp_path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    stats = tmp_path / "diskstats"

    def write(reads: int, sectors: int) -> None:
        stats.write_text(f"   7       0 loop0 1 0 8 0 0 0 0 0 0 0 0\n"
                         f" {major} {minor} disk {reads} 0 {sectors} 5 0 0 0 0 0 9 9\n")

    disk = DiskRequests(tmp_path)
    disk.stats_path = str(stats)
    write(100, 2048)
    before = disk.read()
    assert before == (100, 2048 * 512)
    write(110, 2048 + 10 * 2048)  # ten more requests of 1 MiB each
    assert disk.kib_per_request(before) == pytest.approx(1024.0)
    assert disk.kib_per_request(None) is None
    write(110, 99999)
    assert disk.kib_per_request(disk.read()) is None  # no new requests: no average
    stats.write_text("garbage\n")
    assert disk.read() is None
