"""The store probe: a node that serves no store read for a while still shows its store's
service time (a slow store the scheduler steers around stays seen), and the probe is not a
turn's read (read counters, access counts and hot-block evidence untouched)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dualpath_cli.core.layout import BlockShape, Namespace, prefix_keys
from dualpath_cli.storage import MemoryStore, PosixStore, ReadOp, StorageLoader, encode_block
from dualpath_cli.storage.probe import StoreProbe
from dualpath_cli.telemetry import MetricsRegistry

SHAPE = BlockShape(n_layers=2, block_tokens=16, bytes_per_token_layer=64)
NS = Namespace("m", "layer_major", SHAPE, "fp16")
KEYS = prefix_keys(list(range(16 * 2)), NS)
SERVICE = "dualpath_storage_read_service_seconds"
PROBES = "dualpath_storage_probe_reads_total"
READS = "dualpath_storage_read_blocks_total"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _loader(store: MemoryStore | PosixStore, reg: MetricsRegistry,
            clock: _Clock) -> StorageLoader:
    for i, key in enumerate(KEYS):
        store.put(*encode_block(key, np.full((2, 16, 32), i, dtype=np.float16), NS))
    return StorageLoader(store, node=1, registry=reg, clock=clock, workers=1)


@pytest.mark.parametrize("kind", ["memory", "posix"])
def test_a_quiet_node_is_probed_every_interval_and_the_probe_is_no_turns_read(
        kind: str, tmp_path: Path) -> None:
    reg, clock = MetricsRegistry(), _Clock()
    store: MemoryStore | PosixStore = (MemoryStore(registry=reg) if kind == "memory" else
                                       PosixStore(tmp_path / "s", registry=reg))
    with _loader(store, reg, clock) as loader:
        probe = StoreProbe(loader, every_s=2.0, start=False)
        assert probe.probe() is None  # no block read yet: nothing known to exist
        res = loader.load([KEYS[0]])
        assert res.store_hits == 1
        for b in res.blocks:
            if b is not None:
                b.release()
        reads, batches = reg.value(READS, node="1"), reg.value(SERVICE, node="1")
        access = dict(store.access_counts())
        clock.now += 1.0
        assert probe.probe() is None  # read 1 s ago: not quiet for 2 s yet
        clock.now += 1.5
        assert probe.probe() == 0.0  # the fake clock stands still during the read
        assert reg.value(SERVICE, node="1") == batches + 1
        assert reg.value(PROBES, node="1") == 1 and probe.probes == 1
        assert reg.value(READS, node="1") == reads  # not a turn's read
        assert dict(store.access_counts()) == access  # nor a hot block's
        assert probe.probe() is None  # the probe restarts the interval
        clock.now += 2.0
        assert probe.probe() is not None and probe.probes == 2


def test_a_slow_store_fault_shows_in_the_probes_service_time() -> None:
    """The probe goes down the loader's own path: the read hook, where read_latency acts."""
    reg, clock = MetricsRegistry(), _Clock()
    with _loader(MemoryStore(registry=reg), reg, clock) as loader:
        res = loader.load([KEYS[1]])
        for b in res.blocks:
            if b is not None:
                b.release()
        seen: list[ReadOp] = []

        def slow(ops: list[ReadOp], started: float) -> float:
            seen.extend(ops)
            clock.now += 0.2  # the store answers 200 ms later
            return started

        loader.set_read_hook(slow)
        clock.now += 5.0
        total = reg.family(SERVICE).labels(node="1").sum
        assert probe_once(loader) == pytest.approx(0.2)
        assert [op.key for op in seen] == [KEYS[1]] and seen[0].probe
        assert reg.family(SERVICE).labels(node="1").sum == pytest.approx(total + 0.2)


def probe_once(loader: StorageLoader) -> float | None:
    return StoreProbe(loader, every_s=2.0, start=False).probe()


def test_the_probe_thread_stops_on_close() -> None:
    reg = MetricsRegistry()
    with StorageLoader(MemoryStore(registry=reg), registry=reg, workers=1) as loader:
        probe = StoreProbe(loader, every_s=0.01)
        assert probe._thread is not None and probe._thread.is_alive()
        probe.close()
        assert probe._thread is None
        probe.close()  # idempotent
    with pytest.raises(ValueError, match="every_s"):
        StoreProbe(loader, every_s=0)


def test_a_corrupt_block_the_probe_finds_is_counted_and_probed_no_more(tmp_path: Path) -> None:
    """The probe's block went bad on disk: the store quarantines it, the node counts the
    corruption as a turn's read would, and the probe waits for a block read anew."""
    from dualpath_cli.storage.header import HEADER_SIZE

    reg, clock = MetricsRegistry(), _Clock()
    store = PosixStore(tmp_path / "s", registry=reg)
    with _loader(store, reg, clock) as loader:
        res = loader.load([KEYS[0]])
        for b in res.blocks:
            if b is not None:
                b.release()
        path = store.path(KEYS[0])
        raw = bytearray(path.read_bytes())
        raw[HEADER_SIZE + 10] ^= 0xFF
        path.write_bytes(bytes(raw))
        clock.now += 3.0
        assert probe_once(loader) is not None
        assert sum(v for labels, v in _corrupt(reg)) == 1
        assert loader.last_store_read is None and not store.contains(KEYS[0])
        clock.now += 3.0
        assert probe_once(loader) is None


def _corrupt(reg: MetricsRegistry) -> list[tuple[dict[str, str], float]]:
    return [(labels, child.value) for labels, child
            in reg.family("dualpath_storage_corrupt_blocks_total").samples()]
