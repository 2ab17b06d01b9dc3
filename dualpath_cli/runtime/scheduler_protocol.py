"""What the rest of the system reads and asks of a scheduler, flat or hierarchical.

Why a protocol: the cluster (cluster/system.py), the live cluster and the API hold "the
scheduler" without caring whether it is one
:class:`~dualpath_cli.runtime.scheduler.SchedulerService` or a
:class:`~dualpath_cli.runtime.hierarchy.HierarchicalScheduler` over several; what differs
(its sub-schedulers, which one serves an engine) is asked through typed methods here rather
than probed for with ``getattr``.
"""

from __future__ import annotations

from typing import Any, Protocol

from dualpath_cli.runtime.control import SchedulerChange, Settings
from dualpath_cli.runtime.decisions import DecisionLog
from dualpath_cli.runtime.engine_table import EngineState
from dualpath_cli.runtime.ledger import RequestLedger
from dualpath_cli.runtime.scheduler import SchedulerService
from dualpath_cli.runtime.turns import Ticket, TurnRequest
from dualpath_cli.runtime.wire import Heartbeat
from dualpath_cli.telemetry.view import Decision, EngineView, NodeView, SchedulerView

__all__ = ["MetricsReader", "Scheduler"]


class MetricsReader(Protocol):
    """A metrics registry as it is read (one, or several merged)."""

    def snapshot(self) -> dict[str, list[dict[str, Any]]]: ...

    def value(self, name: str, **labels: object) -> float: ...


class Scheduler(Protocol):
    """A running scheduler as the system sees it (see the module docstring)."""

    @property
    def address(self) -> str: ...

    @property
    def quota_s(self) -> float: ...

    @property
    def requeued(self) -> int: ...

    @property
    def revived(self) -> int: ...

    @property
    def dead_events(self) -> list[tuple[int, float]]: ...

    @property
    def engines(self) -> dict[int, EngineState]: ...

    @property
    def log(self) -> DecisionLog: ...

    @property
    def ledger(self) -> RequestLedger: ...

    @property
    def registry(self) -> MetricsReader: ...

    # -- its shape ------------------------------------------------------------------
    def sub_schedulers(self) -> tuple[SchedulerService, ...]:
        """The sub-schedulers of a hierarchical scheduler (empty for a flat one)."""
        ...

    def schedulers(self) -> tuple[SchedulerService, ...]:
        """Every scheduler that serves engines: the flat one, or each sub."""
        ...

    def owner(self, engine_id: int) -> SchedulerService:
        """The scheduler that serves engine ``engine_id``."""
        ...

    def address_for(self, role: str, group: int) -> str:
        """The endpoint the engines of ``role``'s group ``group`` talk to."""
        ...

    # -- lifecycle ------------------------------------------------------------------
    def register(self, engine_id: int, role: str, node: int, group: int,
                 name: str = "") -> None: ...

    def role_gap_list(self) -> dict[str, tuple[float, str]]: ...

    def start(self) -> None: ...

    def wait_ready(self, timeout: float = 60.0) -> None: ...

    def all_hello(self) -> bool: ...

    def stop(self) -> None: ...

    def mark_dead(self, engine_id: int, why: str = "exited") -> None: ...

    def drain_engines(self, engine_ids: list[int], timeout_s: float) -> None:
        """Let a leaving node's engines finish their turns (``draining``), then leave."""
        ...

    def submit(self, req: TurnRequest) -> Ticket: ...

    def cancel(self, rid: int, error: Exception | None = None) -> None:
        """Drop turn ``rid`` from the queues and answer it with ``error``."""
        ...

    # -- reads and controls ---------------------------------------------------------
    def decisions(self, since: int = -1) -> list[Decision]: ...

    def request(self, rid: int) -> tuple[list[Decision], dict[str, Any] | None]: ...

    def in_flight(self, limit: int | None = None, rid: int | None = None
                  ) -> tuple[float, int, list[dict[str, Any]]]: ...

    def settings(self) -> Settings: ...

    def update(self, change: SchedulerChange) -> tuple[dict[str, Any], dict[str, Any]]: ...

    def control_signals(self) -> dict[str, float | None]: ...

    def fresh_reports(self, after: float, timeout: float = 5.0
                      ) -> dict[int, dict[str, Any]]: ...

    def reports(self) -> dict[int, dict[str, Any]]: ...

    def heartbeats(self) -> dict[int, Heartbeat | None]: ...

    def metrics(self, fresh: bool = False, timeout: float = 5.0
                ) -> dict[int, dict[str, Any]]: ...

    def metric_frames(self) -> dict[int, dict[str, Any]]: ...

    def node_read_q(self) -> dict[int, int]: ...

    def engine_states(self) -> dict[int, str]: ...

    def view_parts(self, snic_bw: float = 0.0, cnic_bw: float = 0.0,
                   ) -> tuple[tuple[EngineView, ...], tuple[NodeView, ...], SchedulerView]: ...
