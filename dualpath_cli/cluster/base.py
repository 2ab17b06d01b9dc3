"""The cluster interface."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from dualpath_cli.runtime.context import EngineSpec

__all__ = ["Cluster", "Respawns"]


class Cluster(Protocol):
    """Starts and supervises engines."""

    #: Called with an engine's id as soon as it stops unexpectedly (None: nobody told).
    on_death: Callable[[int], None] | None

    def start(self, specs: list[EngineSpec]) -> None:
        """Start one engine per spec."""

    def kill(self, engine_id: int) -> None:
        """Stop an engine abruptly (failure injection)."""

    def shutdown(self, timeout: float = 5.0) -> None:
        """Wait for engines to exit (after the scheduler said stop), then force them."""

    def pids(self) -> dict[int, int]:
        """OS pid of each started engine's process, by engine id (in-process: none)."""
        ...

    def exited(self) -> dict[int, int]:
        """Engines whose process has ended, with exit codes (negative: killed by a signal);
        empty where exits are not tracked per engine."""
        ...


@runtime_checkable
class Respawns(Protocol):
    """A cluster that can start a dead engine again (engines as processes: LocalCluster).

    In-process engines (threads of the launcher, tests' fake) and emulated engines (many to
    a host process, which dies with all of them) cannot: their deaths are final.
    """

    def respawn(self, spec: EngineSpec) -> int:
        """Start a new process for the dead engine ``spec`` describes; its pid."""
        ...
