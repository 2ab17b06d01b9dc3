"""The cluster interface."""

from __future__ import annotations

from typing import Protocol

from dualpath_cli.runtime.context import EngineSpec

__all__ = ["Cluster"]


class Cluster(Protocol):
    """Starts and supervises engines."""

    def start(self, specs: list[EngineSpec]) -> None:
        """Start one engine per spec."""

    def kill(self, engine_id: int) -> None:
        """Stop an engine abruptly (failure injection)."""

    def shutdown(self, timeout: float = 5.0) -> None:
        """Wait for engines to exit (after the scheduler said stop), then force them."""
