"""In-process cluster: engines as threads sharing one queue fabric (the shipped fake)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from dualpath_cli.runtime.context import EngineSpec
from dualpath_cli.runtime.engine import run_engine
from dualpath_cli.runtime.model import load_model
from dualpath_cli.transfer.base import Fabric

__all__ = ["InProcCluster"]


class InProcCluster:
    """Runs each engine's loop on a thread; ``kill`` stops it without a goodbye."""

    def __init__(self, fabric: Fabric, on_death: Callable[[int], None] | None = None) -> None:
        self.fabric = fabric
        self.on_death = on_death
        self._threads: dict[int, threading.Thread] = {}
        self._stops: dict[int, threading.Event] = {}
        self._killed: set[int] = set()

    def start(self, specs: list[EngineSpec]) -> None:
        for spec in specs:
            stop = threading.Event()
            t = threading.Thread(target=self._run, args=(spec, stop), daemon=True,
                                 name=f"engine-{spec.engine_id}")
            self._stops[spec.engine_id] = stop
            self._threads[spec.engine_id] = t
            t.start()

    def _run(self, spec: EngineSpec, stop: threading.Event) -> None:
        run_engine(spec, self.fabric, load_model, stop)
        if spec.engine_id in self._killed and self.on_death:
            self.on_death(spec.engine_id)

    def kill(self, engine_id: int) -> None:
        self._killed.add(engine_id)
        self._stops[engine_id].set()

    def pids(self) -> dict[int, int]:
        """None: the engines are threads of this process."""
        return {}

    def exited(self) -> dict[int, int]:
        """None: a thread has no exit code (a killed one is reported through ``on_death``)."""
        return {}

    def shutdown(self, timeout: float = 5.0) -> None:
        for stop in self._stops.values():
            stop.set()
        for t in self._threads.values():
            t.join(timeout)
