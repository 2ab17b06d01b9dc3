"""One node of a multi-node cluster: join the scheduler, run this node's engines, leave.

What ``dualpath launch --role prefill|decode --node NAME --join HOST:PORT`` runs (a Slurm
``srun`` step or a Kubernetes pod per node). The handshake is ``POST /api/v1/join`` with the
cluster's bearer token (:mod:`dualpath_cli.api.join_routes`); its answer
(:class:`~dualpath_cli.cluster.join.JoinPlan`) fixes the engine ids, the node index, the
scheduler's control endpoint and every engine setting. The engines are this host's processes
(:class:`~dualpath_cli.cluster.local.LocalCluster`), sharing this node's storage-NIC
buckets, reading the store at ``--store`` (the same POSIX directory every node mounts). The
scheduler sees them ``hello`` and heartbeat; if this node dies its heartbeats stop and its
turns are re-queued; if it stops cleanly it leaves first (``DELETE /api/v1/join/NAME``).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from dualpath_cli.cluster.join import JoinPlan
from dualpath_cli.cluster.local import LocalCluster
from dualpath_cli.errors import DualPathError
from dualpath_cli.runtime.context import EngineSpec
from dualpath_cli.transfer.shaping import make_bucket
from dualpath_cli.transfer.zmq_fabric import BIND_HOST_ENV

__all__ = ["JoinError", "NodeAgent", "join_url"]


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

    def __post_init__(self) -> None:
        self.plan: JoinPlan | None = None
        self.cluster: LocalCluster | None = None
        self.joined_s: float | None = None
        self.dead: list[int] = []
        self._http = httpx.Client(base_url=self.url, timeout=10.0, headers={
            "Authorization": f"Bearer {self.token}"})

    def _call(self, method: str, path: str, **kw: object) -> httpx.Response:
        try:
            return self._http.request(method, path, **kw)  # type: ignore[arg-type]
        except httpx.HTTPError as err:
            raise JoinError(f"the scheduler at {self.url} is unreachable ({err})") from None

    def join(self, timeout: float = 60.0) -> float:
        """Join, start the engines, wait until the scheduler sees them all ready.

        Returns seconds from the join request to serving.

        Raises:
            JoinError: refused (wrong token, name in use...), unreachable, or not ready in
                time (the engines are stopped again).
        """
        t0 = time.monotonic()
        resp = self._call("POST", "/api/v1/join",
                          json={"node": self.name, "role": self.role, "gpus": self.gpus})
        if resp.status_code != 200:
            raise JoinError(f"the scheduler at {self.url} refused node {self.name!r}: "
                            f"{_detail(resp)}")
        plan = self.plan = JoinPlan.from_dict(resp.json())
        root = self.store if self.store is not None else (
            Path(plan.store) if plan.store else None)
        if root is None:
            raise JoinError("the scheduler has no store directory; give --store")
        specs = self._specs(plan, root)
        os.environ[BIND_HOST_ENV] = self.bind_host  # the engine processes inherit it
        self.cluster = LocalCluster(self.dead.append)
        self.cluster.start(specs)
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            status = self._call("GET", f"/api/v1/join/{self.name}")
            if status.status_code == 200 and status.json().get("ready"):
                self.joined_s = time.monotonic() - t0
                return self.joined_s
            if self.dead:
                break
            time.sleep(0.05)  # polling a remote state (no condition to wait on)
        self.close(leave=True)
        raise JoinError(f"node {self.name!r}: engines not serving within {timeout:g} s"
                        + (f" (engines {sorted(self.dead)} exited)" if self.dead else ""))

    def _specs(self, plan: JoinPlan, root: Path) -> list[EngineSpec]:
        snic = (make_bucket(plan.snic_bw, True), make_bucket(plan.snic_bw, True))
        return [EngineSpec(
            engine_id=eid, role=plan.role, node=plan.node, group=plan.node, leader=i == 0,
            ctl=plan.ctl, snic_read=snic[0], snic_write=snic[1],
            cnic=make_bucket(plan.cnic_bw, True), hbm_blocks=plan.hbm_blocks,
            block_tokens=plan.block_tokens, model=plan.model,
            store={"kind": "posix", "root": str(root)}, codec=plan.codec,
            dram_cache_bytes=plan.dram_cache_bytes, quota_s=plan.quota_s,
            flops_rate=plan.flops_rate, heartbeat_s=plan.heartbeat_s, fetch_s=plan.fetch_s)
            for i, eid in enumerate(plan.engine_ids)]

    def serve(self, stop: threading.Event, check_s: float = 1.0,
              unreachable_s: float = 30.0) -> str:
        """Run until ``stop`` is set, every engine exited, or the scheduler is gone; why."""
        lost_since: float | None = None
        while not stop.wait(check_s):
            assert self.cluster is not None
            if len(self.cluster.exited()) == len(self.cluster.pids()):
                return "every engine exited (the scheduler stopped them)"
            try:
                ok = self._http.get("/healthz").status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                lost_since = None
            elif lost_since is None:
                lost_since = time.monotonic()
            elif time.monotonic() - lost_since > unreachable_s:
                return f"the scheduler at {self.url} has been unreachable for {unreachable_s:g} s"
        return "stopped"

    def close(self, leave: bool = True) -> None:
        """Leave the cluster (its turns are re-queued at once) and stop the engines."""
        if leave and self.plan is not None:
            try:
                self._http.delete(f"/api/v1/join/{self.name}")
            except httpx.HTTPError:
                pass  # the scheduler is gone or busy: our heartbeats stop anyway
        if self.cluster is not None:
            for eid in self.cluster.pids():
                if eid not in self.cluster.exited():
                    self.cluster.kill(eid)
            self.cluster.shutdown(timeout=2.0)
            self.cluster = None
        self._http.close()


def _detail(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail")
    except ValueError:
        detail = None
    return f"HTTP {resp.status_code}" + (f": {detail}" if detail else "")
