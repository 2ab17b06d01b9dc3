"""The scheduler's table of engines: what it knows about each (:class:`EngineState`) and
the reads charged to it that no report counted yet (:class:`Charges`).

Why a table type (:class:`EngineTable`): the scheduler keeps indexes over the engines (by
group, by node) that must be rebuilt whenever an entry is set or removed, by whoever sets
it (``register``, a join, a checkpoint's restore); the table counts those changes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from dualpath_cli.runtime.readmodel import EngineWindow, Rate
from dualpath_cli.runtime.wire import Heartbeat

__all__ = ["ENGINE_STATES", "Charges", "EngineState", "EngineTable"]

#: States an engine is in, as the scheduler sees it.
ENGINE_STATES: tuple[str, ...] = ("starting", "ready", "draining", "dead", "left")


class Charges:
    """An engine's pending read charges (dispatch seq -> tokens) and their sum.

    Why the sum is kept: every snapshot of every engine of a node reads it (a node's read
    queue), several per dispatch; adding and retiring charges are one per dispatch."""

    __slots__ = ("_by_seq", "total")

    def __init__(self) -> None:
        self._by_seq: dict[int, int] = {}
        self.total = 0

    def __len__(self) -> int:
        return len(self._by_seq)

    def add(self, seq: int, tokens: int) -> None:
        self._by_seq[seq] = tokens
        self.total += tokens

    def drop(self, seq: int) -> None:
        self.total -= self._by_seq.pop(seq, 0)

    def retire_through(self, seen: int) -> None:
        """Drop the charges of dispatches up to ``seen`` (a report counted them)."""
        if self._by_seq:
            for seq in [s for s in self._by_seq if s <= seen]:
                self.total -= self._by_seq.pop(seq)

    def clear(self) -> None:
        self._by_seq.clear()
        self.total = 0


@dataclass
class EngineState:
    """What the service knows about one engine."""

    engine_id: int
    role: str
    node: int
    group: int
    name: str = ""  # the operator's name of its node (``--node D0``; ``P0``/``D0`` launched)
    address: str = ""
    pid: int = 0
    last_seen: float = 0.0
    alive: bool = True
    dead_why: str = ""  # "exited" (the cluster saw it go), "silent" (heartbeat timeout), "left"
    drain_until: float = 0.0  # its node is leaving: no new turns; left by then (monotonic)
    orphans: set[int] = field(default_factory=set)  # requests re-queued away from it
    hb: Heartbeat | None = None  # the last heartbeat
    hb_at: float = 0.0  # when it arrived (monotonic)
    metrics: dict[str, Any] = field(default_factory=dict)
    metrics_at: float = 0.0
    rq: int = 0  # tokens in the node loader's queue, as last reported
    rq_n: int = 0  # order of that report
    seen: int = -1  # last dispatch sequence that report counted
    next_seq: int = 0
    charges: Charges = field(default_factory=Charges)  # reads dispatched, not yet reported
    snic_rate: Rate = field(default_factory=Rate)  # storage-NIC read bytes/s
    cnic_rate: Rate = field(default_factory=Rate)  # compute-NIC transmit bytes/s
    compute: EngineWindow = field(default_factory=EngineWindow)  # busy, service time, KV wait
    gpu_rate: Rate = field(default_factory=Rate)  # busy seconds per second (utilisation)
    kv_lost: int = 0  # turns run again because a KV message on its fabric link was lost

    @property
    def read_q(self) -> int:
        """Reported queue plus the reads dispatched since (the scheduler's view)."""
        return self.rq + self.charges.total

    @property
    def state(self) -> str:
        """``starting`` (no hello yet), ``ready``, ``draining`` (its node is leaving: it
        finishes its turns, takes no new ones), ``dead``, or ``left`` (its node left)."""
        if not self.alive:
            return "left" if self.dead_why == "left" else "dead"
        if not self.address:
            return "starting"
        return "draining" if self.drain_until else "ready"

    @property
    def report(self) -> dict[str, Any]:
        """The last heartbeat as a plain dict (counters by name) plus ``received``."""
        if self.hb is None:
            return {}
        out = {f.name: getattr(self.hb, f.name) for f in dataclasses.fields(self.hb)
               if f.name != "metrics"}
        out["received"] = self.hb_at
        return out


class EngineTable(dict[int, EngineState]):
    """The scheduler's engines by id; ``version`` counts the entries set or removed, so an
    index built over them (by group, by node) knows when it must be rebuilt, whoever set
    an entry (``register``, a checkpoint's restore)."""

    version = 0

    def __setitem__(self, key: int, value: EngineState) -> None:
        super().__setitem__(key, value)
        self.version += 1

    def __delitem__(self, key: int) -> None:
        super().__delitem__(key)
        self.version += 1

    def pop(self, *args: Any) -> Any:
        self.version += 1
        return super().pop(*args)

    def clear(self) -> None:
        super().clear()
        self.version += 1

    def update(self, *args: Any, **kw: Any) -> None:
        super().update(*args, **kw)
        self.version += 1
