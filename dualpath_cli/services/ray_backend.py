"""``dualpath launch --backend ray``: the scheduler and the engines as Ray actors.

Why: operators who already run a Ray cluster launch with it rather than with Slurm or
Kubernetes. We do not reimplement placement or supervision; we reuse the per-node join path
(:mod:`dualpath_cli.services.node`) and the restartable scheduler
(:mod:`dualpath_cli.services.restart`). The launch process is only the Ray driver: the
scheduler and its HTTP API run in a :class:`SchedulerActor` (what ``launch --role
scheduler`` runs), pinned to one Ray node (the driver's, or a node carrying the label
``--ray-scheduler-label`` names); every dualpath node (a group of ``cluster.gpus_per_node``
engines) is one :class:`NodeActor` that runs what ``launch --role prefill|decode --join
HOST:PORT`` runs on a node. A node actor is placed by a custom resource (a prefill node's
actor needs one unit of :data:`PREFILL_RESOURCE`, a decode node's one of
:data:`DECODE_RESOURCE`: ``ray start --resources='{"dualpath_prefill": 1}'``) or by a node
label (``--ray-prefill-label dualpath.role=prefill`` with ``ray start --labels
dualpath.role=prefill``: Ray's ``label_selector``).

Two supervisors are in play, on purpose. Our heartbeats detect a dead node first (its engine
processes die with the actor's process and stop heartbeating; after the heartbeat timeout
the scheduler re-queues their turns). Ray's actor restarts (``max_restarts``) then bring the
node back: the restarted actor leaves under its old name (re-queueing at once whatever the
heartbeat timeout has not yet caught) and joins again as a new node. The scheduler's actor
restarts too, on its node (it is pinned there, so its URL and its checkpoint stay): the new
incarnation loads the checkpoint the dead one left in the state directory, binds the same
API and control ports, and the node actors' engines reconnect by themselves. KV bytes never
go through Ray's object store: the engines move them over our ZeroMQ transfer fabric as in
every other launch; Ray carries only the actors' small control calls.

This module is the driver's side (:class:`RayBackend`); the actors are
:mod:`.ray_actors`, the node labels :mod:`.ray_labels`, and what both sides share
:mod:`.ray_common`. Ray is an optional extra (``pip install 'dualpath[ray]'``), imported only
inside functions (:func:`~dualpath_cli.services.ray_common.import_ray`), so the CLI starts
without it. The API itself is the front-end's (``cli/ray_launch.py`` hands the scheduler
actor a factory for it): services import no API.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualpath_cli.services.ray_actors import NodeActor, SchedulerActor
from dualpath_cli.services.ray_common import (
    NAMESPACE,
    RayBackendError,
    actor_name,
    import_ray,
    one_line,
    scheduler_actor_name,
)
from dualpath_cli.services.ray_labels import format_label, label_matches

__all__ = ["RayBackend", "PREFILL_RESOURCE", "DECODE_RESOURCE", "MAX_RESTARTS",
           "resolve_address"]

#: Custom resource a prefill node's actor needs one unit of.
PREFILL_RESOURCE = "dualpath_prefill"
#: Custom resource a decode node's actor needs one unit of.
DECODE_RESOURCE = "dualpath_decode"
#: Times Ray restarts a node's actor after its process dies (then it stays dead).
MAX_RESTARTS = 3
#: Seconds to wait for a TCP connection to the Ray GCS before giving up (Ray itself
#: retries an unreachable address for minutes, printing warnings).
PROBE_S = 5.0
#: Tries of a Ray Client connect whose server side failed to start this driver's server
#: (the head's proxy starts one process per client and gives it
#: ``RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S``, 30 s by default, which a busy head misses).
CLIENT_INIT_TRIES = 3

log = logging.getLogger(__name__)


def _address_file() -> Path:
    """Where ``ray start`` (and ``ray.cluster_utils``) note the local cluster's address."""
    base = os.environ.get("RAY_TMPDIR") or (
        os.environ.get("TMPDIR") if sys.platform.startswith("linux") else None) or "/tmp"
    return Path(base) / "ray" / "ray_current_cluster"


def resolve_address(address: str | None) -> str:
    """The Ray cluster: ``--address``, else ``RAY_ADDRESS``, else ``auto``.

    ``auto`` is the cluster started on this machine (``ray start --head``); ``HOST:PORT`` its
    GCS; ``ray://HOST:PORT`` its Ray Client server (the launcher then drives from off the
    cluster: every actor, the scheduler's included, runs on the cluster's nodes).

    Raises:
        RayBackendError: no cluster is named or found, or the address is malformed.
    """
    text = (address or os.environ.get("RAY_ADDRESS") or "auto").strip()
    if text.startswith("ray://"):
        host, sep, port = text.removeprefix("ray://").rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RayBackendError(f"--address {text!r}: expected ray://HOST:PORT of the Ray "
                                  "Client server (ray start --head serves it on port 10001)")
        return text
    if text == "auto":
        path = _address_file()
        try:
            text = path.read_text().strip()
        except OSError:
            raise RayBackendError(f"--address auto: no Ray cluster runs on this machine "
                                  f"(no {path}); start one with 'ray start --head' or give "
                                  "--address HOST:PORT") from None
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RayBackendError(f"--address {text!r}: expected auto or HOST:PORT of the Ray "
                              "cluster's GCS (ray start --head prints it)")
    return text


def _probe(address: str, timeout: float = PROBE_S) -> None:
    """Fail fast when nothing listens at ``address`` (see :data:`PROBE_S`)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as err:
        why = err.strerror or type(err).__name__
        raise RayBackendError(f"the Ray cluster at {address} is unreachable ({why}); check "
                              "--address, or start it with 'ray start --head'") from None


def _reason(err: BaseException) -> str:
    """One line saying why ``ray.init`` failed.

    Ray Client's init failure is a heading line followed by the server's traceback, whose
    last line names the cause (for example its specific server not starting in time).
    """
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    if not lines:
        return type(err).__name__
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {lines[-1]}"
    return lines[0]


@dataclass
class RayBackend:
    """The launcher's side: connect to Ray, place one :class:`NodeActor` per node, stop them.

    Args:
        address: ``--address`` (``None``: ``RAY_ADDRESS``, else ``auto``).
        port: the launch's API port (names the actors, so two launches can share a cluster).
        loopback: the scheduler serves on loopback, so its engines must run on this host and
            listen on loopback too; otherwise each node's engines bind their node's IP.
        max_restarts: Ray restarts of each node's actor and of the scheduler's.
        labels: ``role -> label_selector`` (``scheduler``, ``prefill``, ``decode``): place
            that role's actors on nodes carrying the label (:func:`parse_label`) instead of
            by custom resource (node roles) or on the driver's node (the scheduler).
    """

    address: str | None
    port: int
    loopback: bool = True
    max_restarts: int = MAX_RESTARTS
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    gcs: str = ""
    actors: dict[str, Any] = field(default_factory=dict)
    placed: list[dict[str, Any]] = field(default_factory=list)
    scheduler: Any = None
    scheduler_info: dict[str, Any] = field(default_factory=dict)
    client: bool = False

    def connect(self) -> None:
        """Connect this process to the Ray cluster as its driver.

        Raises:
            RayBackendError: Ray missing, no cluster found, or unreachable.
        """
        ray = import_ray()
        self.gcs = resolve_address(self.address)
        self.client = self.gcs.startswith("ray://")
        _probe(self.gcs.removeprefix("ray://"))
        if self.client:
            from ray._private.utils import (  # type: ignore[import-not-found,unused-ignore]
                get_ray_client_dependency_error,
            )

            if get_ray_client_dependency_error() is not None:
                raise RayBackendError(f"--address {self.gcs}: Ray Client needs grpcio: pip "
                                      "install 'ray[client]'")
        for attempt in range(1, CLIENT_INIT_TRIES + 1):
            try:
                ray.init(address=self.gcs, namespace=NAMESPACE, logging_level=logging.WARNING,
                         **({} if self.client else {"ignore_reinit_error": True}))
                return
            except (ConnectionError, RuntimeError, ValueError) as err:
                why = _reason(err)
                if (self.client and isinstance(err, ConnectionAbortedError)
                        and attempt < CLIENT_INIT_TRIES):
                    log.warning("ray backend: Ray Client at %s failed to start this driver's "
                                "server (%s); trying again (%d of %d)", self.gcs, why,
                                attempt + 1, CLIENT_INIT_TRIES)
                    continue
                raise RayBackendError(f"cannot connect to the Ray cluster at {self.gcs}: "
                                      f"{why}") from None

    def _check_resources(self, needs: dict[str, int], pd: str) -> None:
        ray = import_ray()
        have = ray.cluster_resources()
        for resource, n in needs.items():
            if n and have.get(resource, 0) < n:
                raise RayBackendError(
                    f"the Ray cluster at {self.gcs} offers {have.get(resource, 0):g} of the "
                    f"{n} {resource!r} units --pd {pd} needs (one per node); start those nodes "
                    f"with ray start --resources='{{\"{resource}\": 1}}'")

    def check_nodes(self, opts: Any) -> None:
        """Refuse, in one line, a cluster that cannot host ``opts``'s nodes.

        Why first: Ray waits forever for an actor no node can take.

        Raises:
            RayBackendError: too few resource units, or no alive node with a role's label.
        """
        pd = f"{opts.prefill_nodes}P{opts.decode_nodes}D"
        counts = {"prefill": opts.prefill_nodes, "decode": opts.decode_nodes}
        resources = {"prefill": PREFILL_RESOURCE, "decode": DECODE_RESOURCE}
        self._check_resources({resources[r]: n for r, n in counts.items()
                               if r not in self.labels}, pd)
        for role, n in counts.items():
            if role in self.labels and n:
                self._labelled_nodes(role)

    def place(self, opts: Any, url: str, token: str, timeout: float,
              on_progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
        """Start every node's actor and wait until the scheduler sees all engines ready.

        Args:
            opts: the launch's ``RuntimeOptions`` (nodes per role, engines per node, store).
            url: the scheduler's API as the nodes reach it.
            token: the cluster's bearer token (passed to the actors, never printed).
            timeout: seconds for every node to be placed and serving.

        Returns:
            :meth:`NodeActor.info` of every node, prefill first.

        Raises:
            RayBackendError: too few labelled nodes, or a node not serving in time.
        """
        ray = import_ray()
        self.check_nodes(opts)
        counts = {"prefill": opts.prefill_nodes, "decode": opts.decode_nodes}
        resources = {"prefill": PREFILL_RESOURCE, "decode": DECODE_RESOURCE}
        remote = ray.remote(NodeActor)
        store = str(opts.store_dir) if opts.store_dir is not None else None
        for role, count in counts.items():
            where: dict[str, Any] = ({"label_selector": self.labels[role]}
                                     if role in self.labels
                                     else {"resources": {resources[role]: 1}})
            for i in range(count):
                name = actor_name(self.port, role, i)
                self.actors[name] = remote.options(
                    name=name, namespace=NAMESPACE, num_cpus=0,
                    max_restarts=self.max_restarts, max_concurrency=2, **where,
                ).remote(url, token, name, role, opts.gpus_per_node, self.loopback, store,
                         timeout)
        refs = {name: a.info.remote() for name, a in self.actors.items()}
        deadline = time.monotonic() + timeout
        pending = dict(refs)
        while pending:
            left = deadline - time.monotonic()
            ready, _ = ray.wait(list(pending.values()), num_returns=1, timeout=max(0.0, left))
            if not ready:
                raise RayBackendError(f"{len(pending)} Ray actors not serving within "
                                      f"{timeout:g} s: {', '.join(sorted(pending))}")
            name = next(n for n, r in pending.items() if r == ready[0])
            del pending[name]
            try:
                info = ray.get(ready[0])
            except ray.exceptions.RayError as err:
                raise RayBackendError(f"Ray actor {name} failed to start: "
                                      f"{one_line(err)}") from None
            if on_progress is not None:
                on_progress(f"{name} on Ray node {info['node_id'][:12]} ({info['ip']}): "
                            f"engines {info['engines']}")
        self.placed = [ray.get(refs[n]) for n in self.actors]
        return self.placed

    def _alive_nodes(self) -> list[dict[str, Any]]:
        ray = import_ray()
        return [n for n in ray.nodes() if n.get("Alive")]

    def _labelled_nodes(self, role: str) -> list[dict[str, Any]]:
        """The alive nodes carrying ``role``'s label; none is one line (Ray would wait)."""
        selector = self.labels[role]
        nodes = [n for n in self._alive_nodes()
                 if label_matches(n.get("Labels") or {}, selector)]
        if not nodes:
            text = format_label(selector)
            raise RayBackendError(
                f"no alive node of the Ray cluster at {self.gcs} carries the label {text} "
                f"(--ray-{role}-label); start one with ray start --labels={text}")
        return nodes

    def driver_node(self) -> dict[str, Any] | None:
        """This driver's Ray node (``None`` through Ray Client: the driver is off-cluster)."""
        if self.client:
            return None
        ray = import_ray()
        here = ray.get_runtime_context().get_node_id()
        return next((n for n in self._alive_nodes() if n["NodeID"] == here), None)

    def scheduler_node(self) -> dict[str, Any]:
        """The Ray node the scheduler's actor is pinned to.

        The first node carrying ``--ray-scheduler-label`` (the driver's own if it does),
        else the driver's node (through Ray Client: the head node). With the API on loopback
        it must be on the launcher's machine, or nobody here could reach it.

        Raises:
            RayBackendError: no node carries the label, or it is another machine while the
                API serves on loopback.
        """
        driver = self.driver_node()
        if "scheduler" in self.labels:
            nodes = self._labelled_nodes("scheduler")
            mine = [n for n in nodes if driver is not None and n["NodeID"] == driver["NodeID"]]
            node = (mine or nodes)[0]
        elif driver is not None:
            node = driver
        else:
            heads = [n for n in self._alive_nodes()
                     if "node:__internal_head__" in n.get("Resources", {})]
            if not heads:
                raise RayBackendError(f"the Ray cluster at {self.gcs} has no alive head node "
                                      "to run the scheduler on; name one with "
                                      "--ray-scheduler-label")
            node = heads[0]
        if self.loopback:
            there = node["NodeManagerAddress"]
            if driver is not None:
                here = driver["NodeManagerAddress"] == there
            else:  # Ray Client: the cluster must be this machine's
                here = _is_loopback_host(self.gcs.removeprefix("ray://").rpartition(":")[0])
            if not here:
                raise RayBackendError(
                    f"the scheduler's Ray node {node['NodeID'][:12]} is {there}, another "
                    f"machine, and the API serves on loopback (--host) there: nothing here "
                    f"could reach it; serve on its address (--host ADDR --allow-remote) or "
                    f"pick a node of this machine")
        return node

    def start_scheduler(self, factory: Callable[[bool], Any], env: dict[str, str],
                        node: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Start the scheduler's actor on ``node``; its :meth:`SchedulerActor.info`.

        Pinned (``NodeAffinitySchedulingStrategy``, not soft): a restart comes back on the
        same node, where its checkpoint is and where the nodes' engines reach its URL.

        Raises:
            RayBackendError: it failed to start (its one-line reason) or not in time.
        """
        ray = import_ray()
        from ray.util.scheduling_strategies import (  # type: ignore[import-not-found,unused-ignore]
            NodeAffinitySchedulingStrategy,
        )

        name = scheduler_actor_name(self.port)
        self.scheduler = ray.remote(SchedulerActor).options(
            name=name, namespace=NAMESPACE, num_cpus=0, max_restarts=self.max_restarts,
            max_task_retries=-1, max_concurrency=4,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
        ).remote(factory, env)
        self.scheduler_info = self._call(self.scheduler.info.remote(), timeout,
                                         f"Ray actor {name}")
        if self.scheduler_info.get("error"):
            raise RayBackendError(f"the scheduler's Ray actor on Ray node {node['NodeID'][:12]}"
                                  f" ({node['NodeManagerAddress']}): "
                                  f"{self.scheduler_info['error']}")
        return self.scheduler_info

    def scheduler_ready(self, timeout: float) -> dict[str, Any]:
        """Wait until the scheduler sees every joined engine ready; its fresh info."""
        self.scheduler_info = self._call(self.scheduler.wait_ready.remote(timeout),
                                         timeout + 30.0, "the scheduler's Ray actor")
        return self.scheduler_info

    def refresh(self, timeout: float = 10.0) -> dict[str, Any]:
        """The scheduler's info now (its turns in flight, say); the last known on failure."""
        with contextlib.suppress(RayBackendError):
            self.scheduler_info = self._call(self.scheduler.info.remote(), timeout,
                                             "the scheduler's Ray actor")
        return self.scheduler_info

    def drain(self, timeout: float) -> dict[str, Any]:
        """The scheduler's actor drains (see :meth:`SchedulerActor.drain`)."""
        return self._call(self.scheduler.drain.remote(timeout), timeout + 30.0,
                          "the scheduler's Ray actor")

    def _call(self, ref: Any, timeout: float, what: str) -> Any:
        ray = import_ray()
        ready, _ = ray.wait([ref], timeout=timeout)
        if not ready:
            raise RayBackendError(f"{what} did not answer within {timeout:g} s")
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as err:
            raise RayBackendError(f"{what} failed: {one_line(err)}") from None

    def watch(self) -> Callable[[], str | None]:
        """A poll for the launcher's loop: a line when the scheduler's actor restarted.

        Each call looks at one outstanding ``info`` call (it waits out a restart, as the
        actor's calls are retried) without blocking.

        Raises:
            RayBackendError: the scheduler's actor died for good (restarts used up, node
                lost).
        """
        ray = import_ray()
        last = dict(self.scheduler_info)
        pending = [self.scheduler.info.remote()]

        def poll() -> str | None:
            ready, _ = ray.wait(pending, timeout=0)
            if not ready:
                return None
            try:
                info = ray.get(ready[0])
            except ray.exceptions.RayError as err:
                raise RayBackendError(f"the scheduler's Ray actor died and Ray will not "
                                      f"restart it: {one_line(err)}") from None
            pending[0] = self.scheduler.info.remote()
            if info["pid"] == last.get("pid"):
                return None
            if info.get("error"):
                raise RayBackendError(f"the scheduler's Ray actor restarted (pid "
                                      f"{info['pid']}) but cannot serve: {info['error']}")
            last.clear()
            last.update(info)
            self.scheduler_info = info
            line = (f"the scheduler's Ray actor restarted (pid {info['pid']} on Ray node "
                    f"{info['node_id'][:12]})")
            restored = info.get("restored")
            if restored:
                line += (f": restored {restored['flights']} turns ({restored['requeued']} "
                         f"re-queued), {restored['engines']} engines")
            return line

        return poll

    def describe(self) -> str:
        """``1P1D as 2 Ray actors and the scheduler's (Ray cluster HOST:PORT)``."""
        n_pre = sum(1 for p in self.placed if p["role"] == "prefill")
        n_dec = len(self.placed) - n_pre
        where = ""
        if self.scheduler_info:
            where = f", the scheduler on Ray node {self.scheduler_info['node_id'][:12]}"
        return (f"{n_pre}P{n_dec}D as {len(self.placed)} Ray actors{where} "
                f"(Ray cluster {self.gcs})")

    def close(self, timeout: float = 10.0) -> None:
        """Stop the scheduler and every node's engines, kill the actors, disconnect.

        The scheduler's actor closes first (it removes its checkpoint: only a scheduler
        that died leaves one to resume from); the Ray cluster stays up.
        """
        if not self.gcs:
            return
        ray = import_ray()
        if not ray.is_initialized():
            return
        try:
            if self.scheduler is not None:
                with contextlib.suppress(ray.exceptions.RayError):
                    ray.wait([self.scheduler.close.remote()], timeout=timeout)
            stops = [a.stop.remote() for a in self.actors.values()]
            if stops:
                ray.wait(stops, num_returns=len(stops), timeout=timeout)
            for a in [*self.actors.values(), self.scheduler]:
                if a is None:
                    continue
                try:
                    ray.kill(a, no_restart=True)
                except (ValueError, ray.exceptions.RayError):
                    pass
            self.actors.clear()
            self.scheduler = None
        finally:
            ray.shutdown()


def _is_loopback_host(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
