"""How far a simulation has got, told to whoever asked while it runs.

Why a simulated-time tick and not a check in the event loop: the loop's innermost ``while``
is the simulator's hot path (sim/events.py); a counter test per event would cost every run.
Instead a run that was given a callback schedules one extra event every
:data:`PROGRESS_TICK_S` simulated seconds; its handler reports and schedules the next while
other events remain. A run without a callback schedules nothing, and with one its results
are bit for bit the same (the tick changes no state; events at equal times keep their order,
and the tick is not counted in the run's events).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["PROGRESS_TICK_S", "RunProgress", "ProgressFn"]

#: Simulated seconds between two reports (a 2,400 s online probe reports 2,400 times).
PROGRESS_TICK_S = 1.0


@dataclass(frozen=True, slots=True)
class RunProgress:
    """One report: the simulated time reached and the turns finished, of one run among
    ``runs`` (``run`` counts from 0: a capacity probe, a compared policy).

    ``turns_total`` is known offline (every turn of every plan), ``horizon_s`` online (the
    run may end sooner by its stop rule).
    """

    sim_s: float
    turns_done: int
    turns_total: int | None = None
    horizon_s: float | None = None
    run: int = 0
    runs: int = 1
    label: str = ""

    @property
    def run_fraction(self) -> float:
        """How far this run is, 0..1."""
        if self.horizon_s:
            done = self.sim_s / self.horizon_s
        elif self.turns_total:
            done = self.turns_done / self.turns_total
        else:
            done = 0.0
        return min(1.0, max(0.0, done)) if math.isfinite(done) else 0.0

    @property
    def fraction(self) -> float:
        """How far all ``runs`` are, 0..1 (earlier runs whole, this one in part)."""
        return min(1.0, (self.run + self.run_fraction) / max(1, self.runs))


ProgressFn = Callable[[RunProgress], None]
