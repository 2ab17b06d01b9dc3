"""One node of a multi-node cluster: join the scheduler, run this node's engines, leave.

What ``dualpath launch --role prefill|decode --node NAME --join HOST:PORT`` runs (a Slurm
``srun`` step or a Kubernetes pod per node). The handshake is ``POST /api/v1/join`` with the
cluster's bearer token (:mod:`dualpath_cli.api.join_routes`); its answer
(:class:`~dualpath_cli.cluster.join.JoinPlan`) fixes the engine ids, the node index, the
scheduler's control endpoint and every engine setting. The engines are this host's processes
(:class:`~dualpath_cli.cluster.local.LocalCluster`), sharing this node's storage-NIC
buckets, reading the store at ``--store`` (the same POSIX directory every node mounts) and
the cluster's replica roots the answer names (mounted at the same paths). The
scheduler sees them ``hello`` and heartbeat; if this node dies its heartbeats stop and its
turns are re-queued; if it stops cleanly it leaves first (``DELETE /api/v1/join/NAME``).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from dualpath_cli.cluster.join import LEAVE_DRAIN_S, JoinPlan
from dualpath_cli.cluster.local import (
    LocalCluster,
    _bare_main,
    describe_exits,
    exit_with_parent,
)
from dualpath_cli.core.restart_policy import EngineRecord
from dualpath_cli.errors import DualPathError
from dualpath_cli.runtime.context import EngineSpec
from dualpath_cli.transfer.shaping import SharedTokenBucket, make_bucket, unlink_shared
from dualpath_cli.transfer.zmq_fabric import BIND_HOST_ENV

__all__ = ["JoinError", "NodeAgent", "join_url", "DEAD_WAIT_S"]

#: How long a node whose engines died waits for the scheduler to hold them dead (its
#: heartbeat timeout, 1 s with ``--role scheduler``) before it joins again.
DEAD_WAIT_S = 30.0


def _store_spec(root: Path, replicas: list[str]) -> dict[str, Any]:
    """The engines' store: the root as mounted here, and the cluster's replica roots (copies
    of hot blocks, at the same paths on every node) so reads rotate over every copy.

    Raises:
        JoinError: a replica root is not a directory here (copies the cluster writes there
            would be invisible to this node: refused, never created).
    """
    missing = [r for r in replicas if not Path(r).is_dir()]
    if missing:
        raise JoinError(f"replica root {missing[0]} (the cluster's storage.replica_roots) is "
                        "not a directory here: mount it at the same path on every node, as "
                        "the store")
    spec: dict[str, Any] = {"kind": "posix", "root": str(root)}
    if replicas:
        spec["replicas"] = list(replicas)
    return spec


class JoinError(DualPathError):
    """The node could not join (refused token, unreachable scheduler, a name in use...)."""


def join_url(address: str) -> str:
    """``HOST:PORT`` (or a URL) of the scheduler's API as a base URL."""
    text = address.strip().rstrip("/")
    if text.startswith(("http://", "https://")):
        return text
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise JoinError(f"--join {address!r}: expected HOST:PORT of the scheduler's API")
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass
class NodeAgent:
    """Joins ``url`` as node ``name`` and runs its engines (see the module docstring).

    Args:
        url: the scheduler's API base URL.
        token: the cluster's bearer token.
        name: this node's name (unique in the cluster).
        role: ``prefill`` or ``decode``.
        gpus: engines to run here.
        store: the store directory as mounted here (default: the scheduler's path).
        bind_host: the address this node's engines listen on (peers must reach it).
    """

    url: str
    token: str
    name: str
    role: str
    gpus: int
    store: Path | None = None
    bind_host: str = "127.0.0.1"
    on_event: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        self.rejoins = 0
        self._forgotten = 0  # consecutive checks that found this node unknown or all dead
        self.plan: JoinPlan | None = None
        self.cluster: LocalCluster | None = None
        self._warm: WarmCluster | None = None  # engine processes started, not yet given specs
        self.joined_s: float | None = None
        self.dead: list[int] = []
        self._deaths = EngineRecord(started_at=time.monotonic())  # for the restart policy
        self._http = httpx.Client(base_url=self.url, timeout=10.0, headers={
            "Authorization": f"Bearer {self.token}"})

    def _call(self, method: str, path: str, **kw: object) -> httpx.Response:
        try:
            return self._http.request(method, path, **kw)  # type: ignore[arg-type]
        except httpx.HTTPError as err:
            raise JoinError(f"the scheduler at {self.url} is unreachable ({err})") from None

    def join(self, timeout: float = 60.0) -> float:
        """Join, start the engines, wait until the scheduler sees them all ready.

        Returns seconds from the join request to serving. The engine processes are
        started (and have done their imports) before the request: see :meth:`prepare`.

        Raises:
            JoinError: refused (wrong token, name in use...), unreachable, or not ready in
                time (the engines are stopped again).
        """
        self.prepare()
        t0 = time.monotonic()
        resp = self._call("POST", "/api/v1/join",
                          json={"node": self.name, "role": self.role, "gpus": self.gpus})
        if resp.status_code != 200:
            self._drop_warm()
            raise JoinError(f"the scheduler at {self.url} refused node {self.name!r}: "
                            f"{_detail(resp)}")
        plan = self.plan = JoinPlan.from_dict(resp.json())
        root = self.store if self.store is not None else (
            Path(plan.store) if plan.store else None)
        if root is None:
            self._drop_warm()
            raise JoinError("the scheduler has no store directory; give --store")
        try:
            specs = self._specs(plan, root)
        except JoinError:
            self._drop_warm()
            raise
        self.cluster, self._warm = self._warm, None
        assert self.cluster is not None
        self.cluster.start(specs)
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            status = self._call("GET", f"/api/v1/join/{self.name}")
            if status.status_code == 200 and status.json().get("ready"):
                self.joined_s = time.monotonic() - t0
                return self.joined_s
            if self.dead:
                break
            time.sleep(0.02)  # polling a remote state (no condition to wait on)
        self.close(leave=True)
        raise JoinError(f"node {self.name!r}: engines not serving within {timeout:g} s"
                        + (f" (engines {sorted(self.dead)} exited)" if self.dead else ""))

    def prepare(self, timeout: float = 120.0) -> float:
        """Start this node's engine processes and wait for their imports, before joining;
        the seconds it took (0 when they were started already).

        Why: spawning a process and importing the engine (numpy, the model, the store:
        about a second, several on a loaded host) took most of the join's window. The
        processes wait, imports done, for the spec the join's answer completes
        (:class:`WarmCluster`); :meth:`join` calls this first if it was not called.

        Raises:
            JoinError: a process died or did not finish its imports within ``timeout``.
        """
        if self._warm is not None:
            return 0.0
        t0 = time.monotonic()
        # a wrong token is refused before any process starts (the join's POST would be too)
        resp = self._call("GET", f"/api/v1/join/{self.name}")
        if resp.status_code in (401, 403):
            raise JoinError(f"the scheduler at {self.url} refused node {self.name!r}: "
                            f"{_detail(resp)}")
        os.environ[BIND_HOST_ENV] = self.bind_host  # the engine processes inherit it
        self._warm = WarmCluster(self.gpus, self.dead.append)
        if not self._warm.wait_ready(timeout):
            self._drop_warm()
            raise JoinError(f"node {self.name!r}: the engine processes did not start within "
                            f"{timeout:g} s")
        return time.monotonic() - t0

    def _specs(self, plan: JoinPlan, root: Path) -> list[EngineSpec]:
        # plain buckets: only their rates travel (the engines were spawned with shared
        # ones, WarmCluster); a shared bucket here would be a semaphore nobody opens
        snic = (make_bucket(plan.snic_bw, False), make_bucket(plan.snic_bw, False))
        from dualpath_cli.transfer.curve import CurveKeys

        # the scheduler's CURVE keys, when it uses CURVE: this node's engines must too
        curve = (CurveKeys(plan.curve_public, plan.curve_secret)
                 if plan.curve_public and plan.curve_secret else None)
        return [EngineSpec(
            engine_id=eid, role=plan.role, node=plan.node, group=plan.node, leader=i == 0,
            ctl=plan.ctl, snic_read=snic[0], snic_write=snic[1],
            cnic=make_bucket(plan.cnic_bw, False), hbm_blocks=plan.hbm_blocks,
            block_tokens=plan.block_tokens, model=plan.model,
            store=_store_spec(root, plan.replica_roots), codec=plan.codec,
            dram_cache_bytes=plan.dram_cache_bytes, quota_s=plan.quota_s,
            flops_rate=plan.flops_rate, heartbeat_s=plan.heartbeat_s, fetch_s=plan.fetch_s,
            curve=curve) for i, eid in enumerate(plan.engine_ids)]

    def serve(self, stop: threading.Event, check_s: float = 1.0,
              unreachable_s: float = 30.0) -> str:
        """Run until ``stop`` is set, every engine exited, or the scheduler is gone; why."""
        lost_since: float | None = None
        while not stop.wait(check_s):
            assert self.cluster is not None
            exited = self.cluster.exited()
            if len(exited) == len(self.cluster.pids()):
                if not any(exited.values()):  # each exited 0: the scheduler stopped them
                    return "every engine exited (the scheduler stopped them)"
                why = self._restart_died(exited, stop)
                if why:
                    return why
                continue
            try:
                ok = self._http.get("/healthz").status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                lost_since = None
                if self._forgotten_by_scheduler():
                    self._rejoin()
            elif lost_since is None:
                lost_since = time.monotonic()
            elif time.monotonic() - lost_since > unreachable_s:
                return f"the scheduler at {self.url} has been unreachable for {unreachable_s:g} s"
        return "stopped"

    def _restart_died(self, exited: dict[int, int], stop: threading.Event) -> str:
        """This node's engines died unasked (a signal, a crash: a nonzero exit): start them
        again, as the launcher's supervisor does on one host (core/restart_policy.py: its
        backoff, and its crash-loop cut-off, after which the node leaves); why it gave up
        ("": it joined again). The new engines join under the same name (a new index)
        once the scheduler holds the dead ones dead (its heartbeat timeout), so their turns
        were re-queued and none is lost."""
        from dualpath_cli.core.restart_policy import RestartPolicy, decide_restart

        policy = RestartPolicy()
        now = time.monotonic()
        decision = decide_restart(policy, self._deaths, now)
        self._deaths = decision.record
        codes = describe_exits(exited)
        if decision.crash_loop:
            return (f"its engines died {decision.recent_deaths} times within "
                    f"{policy.loop_window_s:g} s ({codes}): a crash loop, not restarted")
        if self.on_event is not None:
            self.on_event(f"node {self.name!r}: its engines died ({codes}); starting them "
                          f"again in {decision.delay_s:g} s")
        if stop.wait(decision.delay_s) or not self._held_dead(stop, DEAD_WAIT_S):
            return "stopped" if stop.is_set() else (
                f"the scheduler did not hold its dead engines dead within {DEAD_WAIT_S:g} s")
        try:
            self._rejoin("its engines died")
        except JoinError as err:
            return f"could not join again after its engines died: {err}"
        self._deaths = dataclasses.replace(self._deaths, started_at=time.monotonic())
        return ""

    def _held_dead(self, stop: threading.Event, timeout: float) -> bool:
        """Until the scheduler holds every engine of this node dead or left (bounded)."""
        deadline = time.monotonic() + timeout
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                resp = self._http.get(f"/api/v1/join/{self.name}")
                if resp.status_code == 404:  # it forgot this node: nothing to wait for
                    return True
                states = set((resp.json().get("engines") or {}).values()) \
                    if resp.status_code == 200 else set()
            except (httpx.HTTPError, ValueError, AttributeError):
                states = set()
            if states and states <= {"dead", "left"}:
                return True
            stop.wait(0.1)  # polling a remote state (no condition to wait on)
        return False

    def _forgotten_by_scheduler(self) -> bool:
        """Whether the scheduler no longer serves this node: it does not know it (it was
        restarted without its checkpoint) or holds every engine of it dead (the control
        port could not be kept), on two checks in a row (a restored engine is briefly
        silent until its heartbeats reconnect)."""
        try:
            resp = self._http.get(f"/api/v1/join/{self.name}")
        except httpx.HTTPError:
            return False
        states: dict[str, str] = {}
        if resp.status_code == 200:
            try:
                states = dict(resp.json().get("engines") or {})
            except (ValueError, AttributeError, TypeError):
                return False
        gone = resp.status_code == 404 or (resp.status_code == 200 and bool(states) and all(
            v in ("dead", "left") for v in states.values()))
        self._forgotten = self._forgotten + 1 if gone else 0
        if self._forgotten < 2:
            return False
        self._forgotten = 0
        return True

    def _rejoin(self, why: str = "the scheduler at {url} no longer serves this node "
                "(restarted without its checkpoint?)", timeout: float = 60.0) -> None:
        """Stop this node's engines and join again (a new index and engine ids)."""
        self._forgotten = 0
        self._stop_engines()
        self.dead.clear()
        self.plan = None
        if self.on_event is not None:
            self.on_event(f"node {self.name!r}: {why.format(url=self.url)}; joining again")
        took = self.join(timeout)
        self.rejoins += 1
        if self.on_event is not None:
            assert self.plan is not None
            self.on_event(f"node {self.name!r}: joined again as node {self.plan.node} in "
                          f"{took:.2f} s")

    def _stop_engines(self) -> None:
        if self.cluster is not None:
            for eid in self.cluster.pids():
                if eid not in self.cluster.exited():
                    self.cluster.kill(eid)
            self.cluster.shutdown(timeout=2.0)
            self.cluster = None

    def close(self, leave: bool = True) -> None:
        """Leave the cluster and stop the engines (again: a no-op). Leaving drains: the
        scheduler sends no new turn and the engines finish theirs (state ``draining``, at
        most :data:`~dualpath_cli.cluster.join.LEAVE_DRAIN_S`) before they stop."""
        if self._http.is_closed:
            return
        if leave and self.plan is not None:
            try:
                self._http.delete(f"/api/v1/join/{self.name}")
                self._wait_left(LEAVE_DRAIN_S + 5.0)
            except httpx.HTTPError:
                pass  # the scheduler is gone or busy: our heartbeats stop anyway
        self._drop_warm()
        self._stop_engines()
        self._http.close()

    def _wait_left(self, timeout: float) -> None:
        """Until the scheduler holds every engine of this node left (it finished its turns),
        the engines exited, or ``timeout``."""
        deadline = time.monotonic() + timeout
        told = False
        while time.monotonic() < deadline:
            resp = self._http.get(f"/api/v1/join/{self.name}")
            if resp.status_code != 200:
                return
            states = set((resp.json().get("engines") or {}).values())
            if states <= {"left", "dead"}:
                return
            if self.cluster is not None and len(self.cluster.exited()) == len(
                    self.cluster.pids()):
                return
            if not told and self.on_event is not None:
                told = True
                self.on_event(f"node {self.name!r}: draining (finishing its turns, at most "
                              f"{LEAVE_DRAIN_S:g} s)")
            time.sleep(0.1)  # polling a remote state (no condition to wait on)

    def _drop_warm(self) -> None:
        """Stop engine processes started for a join that did not happen."""
        if self._warm is not None:
            self._warm.shutdown(timeout=2.0)
            self._warm = None


def _detail(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail")
    except ValueError:
        detail = None
    return f"HTTP {resp.status_code}" + (f": {detail}" if detail else "")


_BUCKETS = ("snic_read", "snic_write", "cnic")


def warm_engine_main(conn: Any, snic_read: SharedTokenBucket, snic_write: SharedTokenBucket,
                     cnic: SharedTokenBucket) -> None:
    """Child entry of a pre-started engine: import everything, then wait for the spec.

    The NIC buckets come as process arguments (shared memory is passed only at spawn) with
    no rate yet; the spec's fields and the rates come through ``conn`` once the node has
    joined. A closed pipe (the join was refused, the node stopped) ends the process.
    """
    exit_with_parent()
    from dualpath_cli.runtime.model.threads import limit_blas_threads

    limit_blas_threads(1)
    from dualpath_cli.runtime.engine import run_engine
    from dualpath_cli.runtime.model import load_model
    from dualpath_cli.transfer import ZmqFabric

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the node agent stops us
    try:
        conn.send("ready")
        fields, rates = conn.recv()
    except (EOFError, OSError):
        return
    finally:
        conn.close()
    for name, bucket in (("snic_read", snic_read), ("snic_write", snic_write), ("cnic", cnic)):
        bucket.rate = rates[name] or None
    spec = EngineSpec(**fields, snic_read=snic_read, snic_write=snic_write, cnic=cnic)
    run_engine(spec, ZmqFabric(curve=spec.curve), load_model)


class WarmCluster(LocalCluster):
    """A :class:`LocalCluster` whose ``gpus`` engine processes start before their specs.

    The processes are spawned (and import the engine) at construction; :meth:`start` hands
    each its spec (fields and NIC rates through a pipe; the node's storage-NIC buckets and
    each engine's compute-NIC bucket were passed at spawn, shared as ``make_bucket`` shares
    them). From then on it is a ``LocalCluster``: supervised, killed, shut down alike.
    """

    def __init__(self, gpus: int, on_death: Callable[[int], None] | None = None) -> None:
        super().__init__(on_death)
        from dualpath_cli.limits import check

        check("engines", gpus, f"{gpus} engine processes")  # before any spawn
        self._warm: list[tuple[Any, Any]] = []
        snic = (SharedTokenBucket(None), SharedTokenBucket(None))
        # their semaphores' names are unlinked once every process is ready (wait_ready)
        self._buckets: list[SharedTokenBucket] = list(snic)
        env_keep = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        try:
            with _bare_main():
                for i in range(gpus):
                    ours, theirs = self._ctx.Pipe()
                    self._buckets.append(SharedTokenBucket(None))
                    p = self._ctx.Process(
                        target=warm_engine_main, args=(theirs, *snic, self._buckets[-1]),
                        daemon=True, name=f"dualpath-engine-warm-{i}")
                    p.start()
                    theirs.close()
                    self._warm.append((p, ours))
        finally:
            for k, v in env_keep.items():
                if v is None:
                    os.environ.pop(k, None)

    def wait_ready(self, timeout: float) -> bool:
        """Wait until every process has done its imports; False on a timeout or a death.

        Once all are ready they have all opened the NIC buckets' semaphores (they came as
        arguments), so their names are unlinked: a SIGKILL to the whole node (its resource
        tracker included) leaves no ``/dev/shm/sem.mp-*`` behind.
        """
        deadline = time.monotonic() + timeout
        for _, conn in self._warm:
            try:
                if not conn.poll(max(0.0, deadline - time.monotonic())) or conn.recv() != "ready":
                    return False
            except (EOFError, OSError):
                return False
        unlink_shared(self._buckets)
        return True

    def start(self, specs: list[EngineSpec]) -> None:
        """Give each waiting process its spec (at most one spec per process started)."""
        if len(specs) > len(self._warm):
            raise ValueError(f"{len(specs)} engine specs for {len(self._warm)} started "
                             "engine processes")
        for spec, (p, conn) in zip(specs, self._warm, strict=False):
            fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
                      if f.name not in _BUCKETS}
            rates = {name: getattr(spec, name).rate for name in _BUCKETS}
            conn.send((fields, rates))
            conn.close()
            self._procs[spec.engine_id] = p
        for p, conn in self._warm[len(specs):]:  # more processes than the plan's engines
            conn.close()
            p.join(2.0)
        self._warm = []
        self._watch = threading.Thread(target=self._supervise, daemon=True,
                                       name="cluster-supervisor")
        self._watch.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        for _, conn in self._warm:  # never given a spec: the closed pipe ends them
            conn.close()
        for p, _ in self._warm:
            p.join(timeout)
            if p.is_alive():
                p.kill()
                p.join(1.0)
        self._warm = []
        super().shutdown(timeout)
