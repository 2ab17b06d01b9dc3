"""A token-bucket shaper that makes a loader behave like a storage NIC of a given bandwidth.

Virtual-time formulation: the NIC is a single server of rate ``R``; a read of ``n`` bytes
that started at ``t0`` occupies the slot ``[max(next_free, t0 - burst/R), ... + n/R]`` and its
data counts as delivered at the slot's end. The loader reads the bytes first (the disk is
faster than the NIC being emulated), then waits until the slot ends before handing the block
over. Waiting on absolute deadlines means timer jitter never accumulates, so the long-run
rate is exact; ``rate=None`` (or 0) is "off": as fast as the disk.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["TokenBucket"]


class TokenBucket:
    """Shared by all reader threads of one node.

    Args:
        rate: bytes per second, or ``None``/0 for unshaped.
        burst_bytes: credit an idle NIC accumulates (default 0: strict pacing).
        clock: monotonic clock in seconds (injectable for tests).
        sleep: sleep function (injectable for tests).
    """

    def __init__(self, rate: float | None, burst_bytes: int = 0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if rate is not None and rate < 0:
            raise ValueError(f"shaper rate must be >= 0 bytes/s, got {rate}")
        self.rate = rate or None
        self.burst_bytes = burst_bytes
        self.clock = clock
        self.sleep = sleep
        self._lock = threading.Lock()
        self._next = 0.0
        self._unthrottled: float | None = None  # the rate before a throttle, while one is on

    def throttle(self, fraction: float) -> None:
        """Run at ``fraction`` of the rate in force before the first throttle (a throttled
        storage NIC, a fault); an unshaped bucket stays unshaped."""
        base = self._unthrottled or self.rate
        if base:
            self._unthrottled = base
            self.rate = base * fraction

    def unthrottle(self) -> None:
        """Back to the rate in force before :meth:`throttle` (no-op when not throttled)."""
        if self._unthrottled:
            self.rate, self._unthrottled = self._unthrottled, None

    @property
    def enabled(self) -> bool:
        """True when a rate is set."""
        return self.rate is not None

    def reserve(self, nbytes: int, since: float) -> float:
        """Book ``nbytes`` on the NIC for a read started at ``since``; returns its deadline."""
        if self.rate is None:
            return since
        with self._lock:
            start = max(self._next, since - self.burst_bytes / self.rate)
            self._next = start + nbytes / self.rate
            return self._next

    def wait_until(self, deadline: float) -> None:
        """Sleep until ``deadline`` on the shaper's clock (returns at once when past)."""
        delay = deadline - self.clock()
        if delay > 0:
            self.sleep(delay)
