"""Emulated-engine cluster: 1,152 engines as a few processes (the Cluster seam, for scale).

Why in cluster/: it picks the cost model (the simulator's, from the core profiles) and the
process layout, which is launching; the engines themselves are
:class:`~dualpath_cli.runtime.emulated.EmulatedHost`. Whole nodes go to one host process
(a node's engines share one storage NIC timeline), nodes are spread round-robin over
``hosts`` processes. A host that dies takes its engines with it: ``on_death`` is called for
each, as :class:`~dualpath_cli.cluster.local.LocalCluster` does for one engine.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import resource
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dualpath_cli.cluster.local import _bare_main, exit_with_parent
from dualpath_cli.core.layout import Namespace
from dualpath_cli.runtime.context import EngineSpec
from dualpath_cli.runtime.emulated import MAX_SOCKETS, EmulatedHost, EmulatedSpec

__all__ = ["EmulationSetup", "EmulatedCluster", "emulated_cost_model", "raise_fd_limit",
           "raise_socket_limit"]


@dataclass(frozen=True)
class EmulationSetup:
    """What every emulated host needs besides its engines (picklable).

    Args:
        model / hardware: core profile names the cost model is built from.
        prefill_nodes / decode_nodes: the P/D shape (expert-parallel weights per GPU).
        namespace: the marker blocks' namespace.
        store_root: the shared store directory (``None``: no persistence, no hits).
        speed: emulated seconds per real second.
    """

    model: str
    hardware: str
    prefill_nodes: int
    decode_nodes: int
    namespace: Namespace
    store_root: Path | None = None
    speed: float = 1.0


def emulated_cost_model(setup: EmulationSetup) -> Any:
    """The simulator's cost model for ``setup`` (default calibration)."""
    from dualpath_cli.core.calibration import SimCalibration
    from dualpath_cli.core.costs import build_cost_model
    from dualpath_cli.core.profiles import get_hardware_profile, get_model_profile

    return build_cost_model(get_model_profile(setup.model), get_hardware_profile(setup.hardware),
                            SimCalibration(), setup.prefill_nodes, setup.decode_nodes)


def raise_fd_limit() -> int:
    """Raise this process's open-file limit to its hard limit (1,152 sockets need it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return hard
        except (ValueError, OSError):
            return soft
    return soft


def raise_socket_limit() -> bool:
    """Let this process's shared ZeroMQ context hold a socket per engine.

    Only works before the context's first socket (libzmq reads it once); returns whether the
    limit is in force.
    """
    import zmq

    ctx: zmq.Context[Any] = zmq.Context.instance()
    ctx.set(zmq.MAX_SOCKETS, MAX_SOCKETS)
    return int(ctx.get(zmq.MAX_SOCKETS)) >= MAX_SOCKETS


def emulated_specs(specs: list[EngineSpec]) -> list[EmulatedSpec]:
    """The picklable part of real engine specs (the NIC buckets stay behind)."""
    return [EmulatedSpec(s.engine_id, s.role, s.node, s.group, s.leader, s.ctl,
                         heartbeat_s=s.heartbeat_s, fetch_s=s.fetch_s, quota_s=s.quota_s,
                         hbm_blocks=s.hbm_blocks, block_tokens=s.block_tokens)
            for s in specs]


def host_main(specs: list[EmulatedSpec], setup: EmulationSetup) -> None:
    """Child-process entry: serve ``specs`` until the scheduler stops them."""
    exit_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher stops us
    raise_fd_limit()
    host = EmulatedHost(specs, emulated_cost_model(setup), setup.namespace, setup.store_root,
                        setup.speed)
    host.run()


class EmulatedCluster:
    """Starts ``hosts`` processes of emulated engines; reports a dead host's engines.

    Args:
        setup: cost model and store of the emulation.
        hosts: processes to spread the nodes over (at most one per node).
        on_death: called with each engine id of a host that exited unexpectedly.
    """

    def __init__(self, setup: EmulationSetup, hosts: int = 4,
                 on_death: Callable[[int], None] | None = None) -> None:
        if hosts < 1:
            raise ValueError(f"hosts {hosts}: need at least one emulator process")
        emulated_cost_model(setup)  # a ConfigError here, not a dead host process later
        self.setup = setup
        self.hosts = hosts
        self.on_death = on_death
        self._ctx = mp.get_context("spawn")
        self._procs: list[Any] = []
        self._members: list[list[int]] = []
        self._host_of: dict[int, int] = {}
        self._closing = threading.Event()
        self._watch: threading.Thread | None = None

    def start(self, specs: list[EngineSpec]) -> None:
        by_node: dict[int, list[EmulatedSpec]] = {}
        for s in emulated_specs(specs):
            by_node.setdefault(s.node, []).append(s)
        n = min(self.hosts, len(by_node)) or 1
        chunks: list[list[EmulatedSpec]] = [[] for _ in range(n)]
        for i, node in enumerate(sorted(by_node)):
            chunks[i % n].extend(by_node[node])
        with _bare_main():
            for k, chunk in enumerate(chunks):
                p = self._ctx.Process(target=host_main, args=(chunk, self.setup), daemon=True,
                                      name=f"dualpath-emulated-{k}")
                p.start()
                self._procs.append(p)
                self._members.append([s.engine_id for s in chunk])
                for s in chunk:
                    self._host_of[s.engine_id] = k
        self._watch = threading.Thread(target=self._supervise, daemon=True,
                                       name="emulated-supervisor")
        self._watch.start()

    def _supervise(self) -> None:
        pending = {p.sentinel: k for k, p in enumerate(self._procs)}
        while pending and not self._closing.is_set():
            ready = multiprocessing.connection.wait(list(pending), timeout=0.2)
            for sentinel in ready:
                k = pending.pop(int(sentinel))  # type: ignore[arg-type]
                if not self._closing.is_set() and self.on_death:
                    for eid in self._members[k]:
                        self.on_death(eid)

    def pids(self) -> dict[int, int]:
        """OS pid of each engine's host process, by engine id."""
        return {eid: int(self._procs[k].pid) for eid, k in self._host_of.items()}

    def exited(self) -> dict[int, int]:
        """Empty: a dead host is reported through ``on_death``, not by exit code."""
        return {}

    def host_pids(self) -> list[int]:
        """OS pids of the host processes."""
        return [int(p.pid) for p in self._procs]

    def kill(self, engine_id: int) -> None:
        """Kill the host process of ``engine_id`` (and with it every engine it holds)."""
        self._procs[self._host_of[engine_id]].kill()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._closing.set()
        for p in self._procs:
            p.join(timeout)
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join(1.0)
        if self._watch is not None:
            self._watch.join(1.0)
