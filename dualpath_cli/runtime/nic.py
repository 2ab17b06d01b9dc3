"""Bandwidth-shaped links: the storage NIC of a node and the compute NIC of an engine.

Why a link and not a bucket: a NIC serialises transfers, so a transfer of ``n`` bytes that
starts when the link is busy finishes ``n / bandwidth`` seconds after the previous one. The
link keeps the time it next becomes free in a ``multiprocessing`` shared double, so every
engine process of a node shares its one storage NIC. ``bandwidth <= 0`` means unshaped (the
oracle policy, or a test that wants no waiting). The caller's thread sleeps for the shaped
time, which releases the GIL, so shaping costs no CPU.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from typing import Any

__all__ = ["Link", "LinkStats"]


class LinkStats:
    """Bytes moved and busy seconds, for metrics (process-local)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.busy_s = 0.0
        self._lock = threading.Lock()

    def add(self, nbytes: int, seconds: float) -> None:
        """Account one transfer."""
        with self._lock:
            self.bytes += nbytes
            self.busy_s += seconds


class Link:
    """A serialising link of ``bandwidth`` bytes/s, shareable across processes.

    Args:
        name: label for metrics ("snic0", "cnic3").
        bandwidth: bytes per second; ``<= 0`` disables shaping.
        shared: create the busy-until clock in shared memory (pass to child processes).
    """

    def __init__(self, name: str, bandwidth: float, *, shared: bool = True) -> None:
        self.name = name
        self.bandwidth = float(bandwidth)
        self._free_at: Any = mp.get_context("spawn").Value("d", 0.0) if shared else None
        self._local_free_at = 0.0
        self._local_lock = threading.Lock()
        self.stats = LinkStats()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_local_lock")
        state["stats"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local_lock = threading.Lock()
        self.stats = LinkStats()

    def reserve(self, nbytes: int) -> float:
        """Book ``nbytes`` on the link; returns the wall time (monotonic) it completes."""
        now = time.monotonic()
        if self.bandwidth <= 0 or nbytes <= 0:
            return now
        cost = nbytes / self.bandwidth
        if self._free_at is not None:
            with self._free_at.get_lock():
                start = max(now, self._free_at.value)
                self._free_at.value = start + cost
        else:
            with self._local_lock:
                start = max(now, self._local_free_at)
                self._local_free_at = start + cost
        return start + cost

    def transfer(self, nbytes: int) -> float:
        """Move ``nbytes`` through the link: wait until the booked slot ends.

        Returns the seconds spent waiting (queueing plus transmission).
        """
        t0 = time.monotonic()
        done = self.reserve(nbytes)
        delay = done - t0
        if delay > 0:
            time.sleep(delay)
        self.stats.add(nbytes, max(delay, 0.0))
        return max(delay, 0.0)
