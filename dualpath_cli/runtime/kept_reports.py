"""What a group leader keeps for its next fetch: each engine's newest read-queue report.

Why one class: the real engines (:mod:`~dualpath_cli.runtime.context`) and the emulated
ones (:mod:`~dualpath_cli.runtime.emulated`) lead their groups the same way (paper 6.1:
members send their reports to the leader, which carries them on its
:class:`~dualpath_cli.runtime.wire.Fetch`). Thread-safe: a real leader keeps reports from
its loader's callbacks and its mailbox loop while that loop fetches.
"""

from __future__ import annotations

import threading

__all__ = ["KeptReports"]

Report = tuple[int, int, int, int]  # (eid, n, seen, rq): a QueueReport's fields


class KeptReports:
    """Each engine's newest report (by ``n``) since the last :meth:`take`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_eid: dict[int, Report] = {}

    def keep(self, eid: int, n: int, seen: int, rq: int) -> None:
        """Keep a report unless a newer one of the same engine is kept."""
        with self._lock:
            kept = self._by_eid.get(eid)
            if kept is None or kept[1] < n:
                self._by_eid[eid] = (eid, n, seen, rq)

    def take(self) -> tuple[Report, ...]:
        """The kept reports, for a fetch; none kept after."""
        with self._lock:
            out = tuple(self._by_eid.values())
            self._by_eid.clear()
        return out
