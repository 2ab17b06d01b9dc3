"""NIC shaping for the embedded runtime, on storage's token bucket.

Why here: every emulated NIC (a node's storage NIC in each direction, an engine's compute NIC)
is the same single-server model as :class:`~dualpath_cli.storage.shaper.TokenBucket`, so the
runtime reuses it instead of keeping its own. Engines of one node may live in different
processes yet share one storage NIC, so :class:`SharedTokenBucket` keeps the bucket's
"next free" time in shared memory; the clock is ``time.monotonic``, which is system-wide.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from typing import Any

from dualpath_cli.storage.shaper import TokenBucket

__all__ = ["SharedTokenBucket", "make_bucket", "pay"]


class SharedTokenBucket(TokenBucket):
    """A :class:`TokenBucket` whose timeline is shared by every process it is passed to.

    Pass it to child processes as a ``Process`` argument (spawn); ``rate <= 0`` is unshaped.
    """

    def __init__(self, rate: float | None, burst_bytes: int = 0) -> None:
        super().__init__(rate, burst_bytes)
        self._shared: Any = mp.get_context("spawn").Value("d", 0.0)

    def reserve(self, nbytes: int, since: float) -> float:
        """Book ``nbytes`` for a transfer started at ``since``; returns its deadline."""
        if self.rate is None:
            return since
        with self._shared.get_lock():
            start = max(self._shared.value, since - self.burst_bytes / self.rate)
            self._shared.value = start + nbytes / self.rate
            return float(self._shared.value)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in ("_lock", "clock", "sleep"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self.clock = time.monotonic
        self.sleep = time.sleep


def make_bucket(rate: float, shared: bool) -> TokenBucket:
    """A bucket of ``rate`` bytes/s (``<= 0``: unshaped); ``shared`` for multi-process use."""
    bps = rate if rate > 0 else None
    return SharedTokenBucket(bps) if shared else TokenBucket(bps)


def pay(bucket: TokenBucket, nbytes: int) -> float:
    """Move ``nbytes`` through the NIC: wait until its slot ends; returns seconds waited."""
    if not bucket.enabled or nbytes <= 0:
        return 0.0
    now = bucket.clock()
    deadline = bucket.reserve(nbytes, now)
    bucket.wait_until(deadline)
    return max(0.0, deadline - now)
