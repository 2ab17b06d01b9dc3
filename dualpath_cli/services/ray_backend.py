"""``dualpath launch --backend ray``: the engines as Ray actors on a Ray cluster's nodes.

Why: operators who already run a Ray cluster launch with it rather than with Slurm or
Kubernetes. We do not reimplement placement or supervision; we reuse the per-node join path
(:mod:`dualpath_cli.services.node`). The launch process runs the scheduler exactly as
``launch --role scheduler`` does and is the Ray driver; every dualpath node (a group of
``cluster.gpus_per_node`` engines) is one :class:`NodeActor` that runs what
``launch --role prefill|decode --join HOST:PORT`` runs on a node. Placement is by custom
resources: a prefill node's actor needs one unit of :data:`PREFILL_RESOURCE`, a decode
node's one of :data:`DECODE_RESOURCE` (``ray start --resources='{"dualpath_prefill": 1}'``).

Two supervisors are in play, on purpose. Our heartbeats detect a dead node first (its engine
processes die with the actor's process and stop heartbeating; after the heartbeat timeout
the scheduler re-queues their turns). Ray's actor restarts (``max_restarts``) then bring the
node back: the restarted actor leaves under its old name (re-queueing at once whatever the
heartbeat timeout has not yet caught) and joins again as a new node. KV bytes never go
through Ray's object store: the engines move them over our ZeroMQ transfer fabric as in
every other launch; Ray carries only the actors' small control calls.

Ray is an optional extra (``pip install 'dualpath[ray]'``) and is imported only here, inside
functions, so the CLI starts without it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualpath_cli.errors import DualPathError

__all__ = ["RayBackend", "RayBackendError", "NodeActor", "PREFILL_RESOURCE",
           "DECODE_RESOURCE", "NAMESPACE", "MAX_RESTARTS", "actor_name", "resolve_address"]

#: Custom resource a prefill node's actor needs one unit of.
PREFILL_RESOURCE = "dualpath_prefill"
#: Custom resource a decode node's actor needs one unit of.
DECODE_RESOURCE = "dualpath_decode"
#: Ray namespace of our actors (``ray.get_actor(name, namespace=NAMESPACE)``).
NAMESPACE = "dualpath"
#: Times Ray restarts a node's actor after its process dies (then it stays dead).
MAX_RESTARTS = 3
#: Seconds to wait for a TCP connection to the Ray GCS before giving up (Ray itself
#: retries an unreachable address for minutes, printing warnings).
PROBE_S = 5.0


class RayBackendError(DualPathError):
    """Ray is not installed, its cluster is unreachable, or it cannot host the engines."""


def actor_name(port: int, role: str, index: int) -> str:
    """The Ray actor name of ``role`` node ``index`` of the launch on API ``port``."""
    return f"dualpath-{port}-{role}-{index}"


def _address_file() -> Path:
    """Where ``ray start`` (and ``ray.cluster_utils``) note the local cluster's address."""
    base = os.environ.get("RAY_TMPDIR") or (
        os.environ.get("TMPDIR") if sys.platform.startswith("linux") else None) or "/tmp"
    return Path(base) / "ray" / "ray_current_cluster"


def resolve_address(address: str | None) -> str:
    """``HOST:PORT`` of the Ray cluster: ``--address``, else ``RAY_ADDRESS``, else ``auto``.

    ``auto`` is the cluster started on this machine (``ray start --head``).

    Raises:
        RayBackendError: no cluster is named or found, or the address is malformed.
    """
    text = (address or os.environ.get("RAY_ADDRESS") or "auto").strip()
    if text.startswith("ray://"):
        raise RayBackendError(f"--address {text}: Ray Client addresses (ray://) are not "
                              "supported; run the launcher on a cluster node and give the "
                              "GCS address HOST:PORT (or auto)")
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


def _import_ray() -> Any:
    try:
        import ray  # type: ignore[import-not-found,unused-ignore]  # the optional extra
    except ImportError:
        raise RayBackendError("--backend ray needs Ray: pip install 'dualpath[ray]'") from None
    return ray


class NodeActor:
    """One dualpath node as a Ray actor: joins the scheduler and runs its engines.

    The constructor is what ``launch --role ROLE --join URL`` does up to "serving"; Ray runs
    it again when it restarts the actor, which then first takes its old incarnation out of
    scheduling. The engines are child processes of the actor's worker and exit with it
    (``cluster/local.py``'s parent watchdog), so a killed actor stops heartbeating at once.
    """

    def __init__(self, url: str, token: str, name: str, role: str, gpus: int,
                 loopback: bool, store: str | None, timeout: float) -> None:
        from dualpath_cli.services.node import NodeAgent

        ray = _import_ray()
        ctx = ray.get_runtime_context()
        with warnings.catch_warnings():  # the property reads a deprecated actor_id inside
            warnings.simplefilter("ignore")
            self.restarted = bool(ctx.was_current_actor_reconstructed)
        self.node_id = ctx.get_node_id()
        self.ip = ray.util.get_node_ip_address()
        bind = "127.0.0.1" if loopback else self.ip
        self.agent = NodeAgent(url, token, name, role, gpus,
                               Path(store) if store is not None else None, bind)
        self._record = _record_path(name)
        if self.restarted:  # our previous process died: its engines leave now
            self._leave_old(url, token, name)
            _unlink_recorded(self._record)
        self.join_s = self.agent.join(timeout)
        _record_semaphores(self._record)
        # as on a --join node: rejoin a restarted scheduler, give up on a vanished one
        self._stop = threading.Event()
        self._serving = threading.Thread(target=self.agent.serve, args=(self._stop,),
                                         name="node-agent", daemon=True)
        self._serving.start()

    @staticmethod
    def _leave_old(url: str, token: str, name: str) -> None:
        import httpx

        try:
            httpx.delete(f"{url}/api/v1/join/{name}", timeout=10.0,
                         headers={"Authorization": f"Bearer {token}"})
        except httpx.HTTPError:
            pass  # the join below reports an unreachable scheduler

    def info(self) -> dict[str, Any]:
        """Where the node runs and what the scheduler gave it (JSON-able)."""
        plan = self.agent.plan
        assert plan is not None
        return {"name": plan.name, "role": plan.role, "index": plan.node,
                "engines": list(plan.engine_ids), "node_id": self.node_id, "ip": self.ip,
                "pid": os.getpid(), "restarted": self.restarted,
                "join_s": round(self.join_s, 3)}

    def stop(self) -> None:
        """Stop the engines (the scheduler is closing; no need to leave)."""
        self._stop.set()
        self._serving.join(5.0)
        self.agent.close(leave=False)
        _remove_record(self._record)


@dataclass
class RayBackend:
    """The launcher's side: connect to Ray, place one :class:`NodeActor` per node, stop them.

    Args:
        address: ``--address`` (``None``: ``RAY_ADDRESS``, else ``auto``).
        port: the launch's API port (names the actors, so two launches can share a cluster).
        loopback: the scheduler serves on loopback, so its engines must run on this host and
            listen on loopback too; otherwise each node's engines bind their node's IP.
        max_restarts: Ray restarts of each node's actor.
    """

    address: str | None
    port: int
    loopback: bool = True
    max_restarts: int = MAX_RESTARTS
    gcs: str = ""
    actors: dict[str, Any] = field(default_factory=dict)
    placed: list[dict[str, Any]] = field(default_factory=list)

    def connect(self) -> None:
        """Connect this process to the Ray cluster as its driver.

        Raises:
            RayBackendError: Ray missing, no cluster found, or unreachable.
        """
        ray = _import_ray()
        self.gcs = resolve_address(self.address)
        _probe(self.gcs)
        try:
            ray.init(address=self.gcs, namespace=NAMESPACE, logging_level=logging.WARNING,
                     ignore_reinit_error=True)
        except (ConnectionError, RuntimeError, ValueError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise RayBackendError(f"cannot connect to the Ray cluster at {self.gcs}: "
                                  f"{first}") from None

    def _check_resources(self, needs: dict[str, int], pd: str) -> None:
        ray = _import_ray()
        have = ray.cluster_resources()
        for resource, n in needs.items():
            if n and have.get(resource, 0) < n:
                raise RayBackendError(
                    f"the Ray cluster at {self.gcs} offers {have.get(resource, 0):g} of the "
                    f"{n} {resource!r} units --pd {pd} needs (one per node); start those nodes "
                    f"with ray start --resources='{{\"{resource}\": 1}}'")

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
        ray = _import_ray()
        pd = f"{opts.prefill_nodes}P{opts.decode_nodes}D"
        self._check_resources({PREFILL_RESOURCE: opts.prefill_nodes,
                               DECODE_RESOURCE: opts.decode_nodes}, pd)
        remote = ray.remote(NodeActor)
        store = str(opts.store_dir) if opts.store_dir is not None else None
        for role, count, resource in (("prefill", opts.prefill_nodes, PREFILL_RESOURCE),
                                      ("decode", opts.decode_nodes, DECODE_RESOURCE)):
            for i in range(count):
                name = actor_name(self.port, role, i)
                self.actors[name] = remote.options(
                    name=name, namespace=NAMESPACE, num_cpus=0, resources={resource: 1},
                    max_restarts=self.max_restarts, max_concurrency=2,
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
                                      f"{_one_line(err)}") from None
            if on_progress is not None:
                on_progress(f"{name} on Ray node {info['node_id'][:12]} ({info['ip']}): "
                            f"engines {info['engines']}")
        self.placed = [ray.get(refs[n]) for n in self.actors]
        return self.placed

    def describe(self) -> str:
        """``1P1D on Ray (2 nodes as actors, GCS HOST:PORT)`` for the ready line."""
        n_pre = sum(1 for p in self.placed if p["role"] == "prefill")
        n_dec = len(self.placed) - n_pre
        return (f"{n_pre}P{n_dec}D as {len(self.placed)} Ray actors "
                f"(Ray cluster {self.gcs})")

    def close(self, timeout: float = 10.0) -> None:
        """Stop every actor's engines, kill the actors, disconnect (the cluster stays up)."""
        if not self.gcs:
            return
        ray = _import_ray()
        if not ray.is_initialized():
            return
        try:
            stops = [a.stop.remote() for a in self.actors.values()]
            if stops:
                ray.wait(stops, num_returns=len(stops), timeout=timeout)
            for a in self.actors.values():
                try:
                    ray.kill(a, no_restart=True)
                except (ValueError, ray.exceptions.RayError):
                    pass
            self.actors.clear()
        finally:
            ray.shutdown()


# --- named semaphores of a killed actor ----------------------------------------------------
# The engines' shared NIC buckets are multiprocessing values, each with a named POSIX
# semaphore (/dev/shm/sem.mp-*). multiprocessing's resource tracker unlinks them when their
# process dies, but when Ray kills an actor's worker it kills the worker's children too,
# tracker included, so the names would stay behind. The actor notes the names it has open;
# its restarted incarnation (on the same node, as a rule) unlinks what is left.
def _record_path(name: str) -> Path:
    base = os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()
    return Path(base) / f"dualpath-ray-{os.getuid()}" / f"{name}.semaphores"


def _record_semaphores(record: Path) -> None:
    """Note the named semaphores this process's engines map (Linux; elsewhere nothing).

    The engines' maps, not ours: the creator maps a semaphore under glibc's temporary name.
    """
    import psutil

    names: set[str] = set()
    for child in psutil.Process().children(recursive=True):
        try:
            maps = Path(f"/proc/{child.pid}/maps").read_text()
        except OSError:
            continue
        names.update(re.findall(r"/dev/shm/(sem\.mp-[\w-]+)", maps))
    if not names:
        return
    try:
        record.parent.mkdir(mode=0o700, exist_ok=True)
        record.write_text("".join(n + "\n" for n in sorted(names)))
    except OSError:
        pass  # best effort: only a leak after a kill depends on it


def _unlink_recorded(record: Path) -> None:
    """Unlink the semaphores a killed previous incarnation noted (see above)."""
    try:
        names = record.read_text().split()
    except OSError:
        return
    for n in names:
        if re.fullmatch(r"sem\.mp-[\w-]+", n):
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{n}")
    _remove_record(record)


def _remove_record(record: Path) -> None:
    with contextlib.suppress(OSError):
        record.unlink()
    with contextlib.suppress(OSError):
        record.parent.rmdir()  # only when no other actor's record is left


def _one_line(err: BaseException) -> str:
    """The most telling line of a Ray error (its cause's last line)."""
    cause = getattr(err, "cause", None)
    text = str(cause if isinstance(cause, BaseException) else err).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else type(err).__name__
