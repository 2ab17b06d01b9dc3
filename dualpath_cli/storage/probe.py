"""A probe read of a node's store while the node reads nothing: a slow store stays seen.

Why: the scheduler steers reads away from a node whose read queue grows, so a store that
turns slow can end up serving no read at all, and with no read there is no service time to
grade (diagnose's store-latency rule, issue 33: a steady 200 ms fault on a decode node's
store went unseen for a whole run). A :class:`StoreProbe` reads one block the node has
read before, once every ``every_s`` seconds in which the loader served no store read, down
the loader's own path (the store's batched read, then its read hook, where a slow- or
failing-store fault acts) and counts its service time in
``dualpath_storage_read_service_seconds`` like a batch of turns' reads, and itself in
``dualpath_storage_probe_reads_total``. It is not a turn's read: not counted in the read
counters, the hot-block evidence or the store's access counts (``ReadOp.probe``), not paced
by the storage NIC (one block every few seconds), and its bytes are released at once.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from dualpath_cli.storage.store import ReadOp

if TYPE_CHECKING:
    from dualpath_cli.storage.loader import StorageLoader

__all__ = ["StoreProbe", "PROBE_S"]

log = logging.getLogger(__name__)

#: Seconds without a store read after which a node's store is probed (and between probes):
#: 15 in a 30 s window, over store-latency's minimum of 10.
PROBE_S = 2.0


class StoreProbe:
    """Probes ``loader``'s store on a thread of its own; :meth:`probe` is one step."""

    def __init__(self, loader: StorageLoader, every_s: float = PROBE_S,
                 start: bool = True) -> None:
        if not every_s > 0:
            raise ValueError(f"every_s must be > 0, got {every_s}")
        self.loader = loader
        self.every_s = every_s
        self.probes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._m_probes = loader.registry.counter(
            "dualpath_storage_probe_reads_total", node=loader.node)
        if start:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"dp-probe-{loader.node}")
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.probe()
            except Exception as err:  # noqa: BLE001 - a probe must never kill its thread
                log.debug("store probe on node %s failed: %s", self.loader.node, err)

    def probe(self) -> float | None:
        """Read the last block the loader read if it served no store read for ``every_s``;
        the probe's service time, or None when none was due (or no block is known yet)."""
        loader = self.loader
        last = loader.last_store_read
        if last is None:
            return None
        at, key = last
        if loader.clock() - at < self.every_s:
            return None
        op = ReadOp(key, probe=True)
        started = loader.clock()
        try:
            loader.store.read_batch([op], loader.pool)
        except Exception as err:  # noqa: BLE001 - a failing store is timed like a slow one
            op.missing, op.io_error = True, str(err)
        hook = loader.read_hook
        if hook is not None:
            hook([op], started)
        seconds = loader.clock() - started
        loader.metrics.count_service(seconds)
        if op.buffer is not None:
            op.buffer.release()
            op.buffer = None
        # corruption a probe finds is corruption found (the store quarantined the copy):
        # counted as a turn's read would count it
        found = [e.reason for e in op.copy_errors]
        if op.error is not None:
            found.append(op.error.reason)
        if found:
            loader.metrics.count_reads(0, 0, 0, {r: found.count(r) for r in set(found)}, [])
        # the next is due every_s on; a block gone (missing, quarantined) is probed no more
        loader.last_store_read = ((loader.clock(), key) if op.header is not None
                                  or op.io_error is not None else None)
        self.probes += 1
        self._m_probes.inc()
        return seconds

    def close(self) -> None:
        """Stop the thread (a probe in progress finishes first). Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
