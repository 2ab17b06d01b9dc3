"""What a scheduler's checkpoint saves, as one typed value (:class:`SchedulerState`).

Why a value and not the scheduler's fields: the checkpoint (runtime/checkpoint.py) writes
and reads it without knowing how the scheduler keeps its queues;
:meth:`~dualpath_cli.runtime.scheduler.SchedulerService.export_state` copies it under the
scheduler's lock and :meth:`~dualpath_cli.runtime.scheduler.SchedulerService.import_state`
puts one back into a scheduler whose thread has not started.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dualpath_cli.runtime.turns import Ticket, TurnRequest

__all__ = ["FlightRow", "EngineRow", "SchedulerState"]

#: A turn in flight: (rid, request, attempt, submitted (monotonic), max hit blocks or None,
#: PE, DE). Plain tuples: the copy is made under the lock while every message waits.
FlightRow = tuple[int, TurnRequest, int, float, "int | None", int, int]
#: An engine: (id, role, node, group, address, pid, alive, dead_why, next dispatch seq).
EngineRow = tuple[int, str, int, int, str, int, bool, str, int]


@dataclass
class SchedulerState:
    """A scheduler's queues, engines, thresholds and counters at one moment."""

    address: str
    """Its control endpoint (nodes that joined send there)."""
    next_rid: int
    ordinal: int
    decision_seq: int
    requeued: int
    policy: str
    read_side: str
    alpha: int
    beta: int
    z_factor: float
    quota_s: float
    sources: dict[str, str]
    controllers: dict[str, bool]
    controller_values: dict[str, float]
    flights: list[FlightRow] = field(default_factory=list)
    """Every turn not finished, in any order (a restore puts them back by rid)."""
    where: dict[int, str] = field(default_factory=dict)
    """rid -> ``fifo``, ``group:G`` (routed) or ``pe_queue`` (placed); absent: dispatched."""
    engines: list[EngineRow] = field(default_factory=list)
    tickets: dict[int, Ticket] = field(default_factory=dict)
    """rid -> the ticket its caller waits on (not saved: a restore makes new ones)."""
    taken_at: float = 0.0
    """When it was copied (monotonic): the flights' ages are measured from it."""
