"""Host load for benchmarks: CPU other processes take, and this session's CPU priority.

Why: benchmarks here share a small machine. On Linux with autogroup scheduling
(``kernel.sched_autogroup_enabled``) ``nice`` only ranks processes within one session, so
another session's ``nice -n 19`` job still takes a fair share of the cores from a whole
benchmark process tree; measured, it turned the simulator-vs-runtime check's 2P1D dualpath
row from -7% into -27%. Benchmarks raise their own session's autogroup priority while they
measure (:func:`cpu_priority`; needs CAP_SYS_NICE, restored afterwards) and report the CPU
other processes used anyway (:class:`ForeignCpu`), so a table says how clean it is.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["tree_cpu_seconds", "AUTOGROUP", "AUTOGROUP_ENABLED", "BOOST_NICE", "FOREIGN_WARN_CORES",
           "autogroup_nice", "set_autogroup_nice", "cpu_priority", "busy_seconds",
           "own_cpu_seconds", "ForeignCpu"]

AUTOGROUP = Path("/proc/self/autogroup")
AUTOGROUP_ENABLED = Path("/proc/sys/kernel/sched_autogroup_enabled")
BOOST_NICE = -20
FOREIGN_WARN_CORES = 0.15  # other processes' mean CPU above which the table is flagged


def autogroup_nice(path: Path = AUTOGROUP) -> int | None:
    """This session's autogroup nice (``/autogroup-52 nice 0`` -> 0), None if unavailable."""
    try:
        return int(path.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def set_autogroup_nice(nice: int, path: Path = AUTOGROUP) -> bool:
    """Set this session's autogroup nice; False when not permitted or not supported."""
    try:
        path.write_text(f"{nice}\n")
    except OSError:
        return False
    return autogroup_nice(path) == nice


@contextmanager
def cpu_priority(enabled: bool, path: Path = AUTOGROUP,
                 flag: Path = AUTOGROUP_ENABLED) -> Iterator[bool]:
    """Raise this session's autogroup priority for the block; yields whether it did.

    Why: under autogroup another session's ``nice`` job competes with this whole process
    tree (the engines included) as an equal, so without this the runtime gets half of a
    2-core machine whenever anyone else computes. Restores the previous value afterwards.
    """
    try:
        active = flag.read_text().strip() == "1"
    except OSError:
        active = False
    before = autogroup_nice(path) if enabled and active else None
    boosted = before is not None and set_autogroup_nice(min(before, BOOST_NICE), path)
    try:
        yield boosted
    finally:
        if boosted and before is not None:
            set_autogroup_nice(before, path)


def busy_seconds(stat_text: str, tick_hz: float) -> float:
    """CPU seconds all cores spent busy, from ``/proc/stat``'s ``cpu`` line.

    Busy: user, nice, system, irq, softirq and steal (the hypervisor's share is also time
    this machine's processes could not run); idle and iowait are not.
    """
    for line in stat_text.splitlines():
        f = line.split()
        if f and f[0] == "cpu":
            user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in f[1:8])
            steal = int(f[8]) if len(f) > 8 else 0
            return (user + nice + system + irq + softirq + steal) / tick_hz
    raise ValueError("no aggregate cpu line in /proc/stat")


def own_cpu_seconds() -> float:
    """CPU seconds of this process and its reaped children (the runtime's engines)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class ForeignCpu:
    """Mean cores other processes kept busy between :meth:`start` and :meth:`stop`.

    Machine busy time (``/proc/stat``) less this process tree's CPU time, over the wall
    time; child processes count once reaped (join them before :meth:`stop`).
    None where ``/proc/stat`` is unavailable.
    """

    def __init__(self, stat: Path = Path("/proc/stat")) -> None:
        self.stat = stat
        self.tick = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
        self._t0 = self._busy0 = self._own0 = 0.0

    def _busy(self) -> float | None:
        try:
            return busy_seconds(self.stat.read_text(), self.tick)
        except (OSError, ValueError):
            return None

    def start(self) -> None:
        """Take the first sample."""
        self._t0, self._busy0, self._own0 = (time.perf_counter(), self._busy() or 0.0,
                                             own_cpu_seconds())

    def stop(self) -> float | None:
        """Foreign cores since :meth:`start`."""
        busy = self._busy()
        wall = time.perf_counter() - self._t0
        if busy is None or wall <= 0:
            return None
        foreign = (busy - self._busy0) - (own_cpu_seconds() - self._own0)
        return max(0.0, foreign) / wall


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of process ``pid`` and its live descendants (0 when it is gone).

    For benchmarks that start a launcher and its engine processes and charge them all.
    """
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total
