"""Bandwidth models: a fair-shared link (processor sharing) and a FIFO byte server.

Why two: a node's storage NIC is shared by up to eight engines reading at once, so its
bandwidth is split equally among the active reads (max-min fair with identical demands);
everything else (per-GPU compute-NIC KV traffic, storage writes) is modelled as a FIFO server
whose "busy until" time is O(1) to update, because the paper's bottleneck-free analysis
(section 4.2) shows those links are not the bottleneck in the configurations we run.
"""

from __future__ import annotations

__all__ = ["SharedLink", "FifoLink", "Flow"]


class Flow:
    """One transfer on a :class:`SharedLink`: bytes left and who to tell when done."""

    __slots__ = ("remaining", "size", "start", "token", "owner")

    def __init__(self, size: float, start: float, token: object, owner: int) -> None:
        self.remaining = size
        self.size = size
        self.start = start
        self.token = token
        self.owner = owner


class SharedLink:
    """A link of ``bandwidth`` bytes/s shared equally by its active flows.

    The owner calls :meth:`add` and :meth:`advance`; the link returns when its next flow
    completes (:meth:`next_finish`) and the caller schedules an event carrying
    :attr:`version`, so stale completions are recognised and dropped. Conservation: the
    bytes delivered between two updates are exactly ``bandwidth * elapsed`` while any flow is
    active (see tests).
    """

    __slots__ = ("bandwidth", "flows", "last", "version", "delivered", "busy_time")

    def __init__(self, bandwidth: float) -> None:
        if bandwidth <= 0:
            raise ValueError("link bandwidth must be positive")
        self.bandwidth = bandwidth
        self.flows: list[Flow] = []
        self.last = 0.0
        self.version = 0
        self.delivered = 0.0
        self.busy_time = 0.0

    def advance(self, now: float) -> None:
        """Move every active flow forward to ``now`` at its fair share."""
        flows = self.flows
        dt = now - self.last
        if flows and dt > 0:
            share = self.bandwidth * dt / len(flows)
            for f in flows:
                f.remaining -= share
            self.delivered += self.bandwidth * dt
            self.busy_time += dt
        self.last = now

    def add(self, now: float, flow: Flow) -> None:
        """Start ``flow`` at ``now`` (advances the others first)."""
        self.advance(now)
        self.flows.append(flow)
        self.version += 1

    def next_finish(self) -> float:
        """Absolute time the next flow completes at the current shares (inf when idle)."""
        flows = self.flows
        if not flows:
            return float("inf")
        n = len(flows)
        least = flows[0].remaining if n == 1 else min([f.remaining for f in flows])
        return self.last + (least if least > 0.0 else 0.0) * n / self.bandwidth  # max(0, least)

    def pop_done(self, now: float) -> list[Flow]:
        """Advance to ``now`` and remove the flows with (almost) nothing left.

        "Almost": less than a microsecond of the link's bandwidth, which absorbs the float
        rounding of event times (never a real byte count at these rates).
        """
        self.advance(now)
        eps = self.bandwidth * 1e-6
        flows = self.flows
        if len(flows) == 1:  # the common case, without the two list scans
            if flows[0].remaining > eps:
                return []
            self.flows = []
            self.version += 1
            return flows
        done = [f for f in flows if f.remaining <= eps]
        if done:
            self.flows = [f for f in flows if f.remaining > eps] if len(done) < len(flows) else []
            self.version += 1
        return done


class FifoLink:
    """A byte server: each transfer starts when the previous one ends (one direction)."""

    __slots__ = ("bandwidth", "free_at", "bytes", "busy_time")

    def __init__(self, bandwidth: float) -> None:
        if bandwidth <= 0:
            raise ValueError("link bandwidth must be positive")
        self.bandwidth = bandwidth
        self.free_at = 0.0
        self.bytes = 0.0
        self.busy_time = 0.0

    def send(self, now: float, nbytes: float) -> float:
        """Queue ``nbytes`` at ``now``; returns when the last byte arrives."""
        start = self.free_at if self.free_at > now else now
        dur = nbytes / self.bandwidth
        self.free_at = start + dur
        self.bytes += nbytes
        self.busy_time += dur
        return self.free_at

