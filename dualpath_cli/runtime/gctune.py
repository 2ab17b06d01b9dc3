"""The garbage collector's pace in a process that hosts a scheduler.

Why: at 48P96D a scheduler allocates a few hundred container objects a turn (flights,
decision records, snapshots, messages), so CPython's default first-generation threshold
(700 allocations) ran a collection every few turns, and each pass, with the older
generations it triggers, walked the scheduler's long-lived state: about 40 us a turn, 8% of
its CPU, in ``bench/control_plane.py --parts inproc``. Nearly all of those objects are
freed by reference counting before any collection sees them, so collecting less often
finds the same garbage with less walking. Cycles still get collected, only in larger,
rarer passes; the memory they hold meanwhile is a few MB at most.
"""

from __future__ import annotations

import gc

__all__ = ["SCHEDULER_GC_THRESHOLD", "pace_gc_for_scheduler"]

#: The first generation's threshold in a scheduler's process (CPython's default: 700).
SCHEDULER_GC_THRESHOLD = 10_000


def pace_gc_for_scheduler() -> None:
    """Raise the first generation's threshold to :data:`SCHEDULER_GC_THRESHOLD` (never
    lower it: a process that set a higher one, or disabled the collector, keeps that)."""
    first, second, third = gc.get_threshold()
    if 0 < first < SCHEDULER_GC_THRESHOLD:
        gc.set_threshold(SCHEDULER_GC_THRESHOLD, second, third)
