"""Nodes that join a running scheduler (``dualpath launch --role ... --join HOST:PORT``).

Why: operators start one process per node with what they already have (a Slurm ``srun``, a
Kubernetes pod); the scheduler's host runs ``launch --role scheduler`` and each node asks it
for a place. The handshake goes through the HTTP API with the cluster's bearer token (a
wrong one is refused there); after it, engines speak the usual wire protocol to the
scheduler's control endpoint, which the answer names. :class:`JoinService` is the scheduler
side: it gives a node an index (its group), engine ids, and every engine setting the node
must not choose itself (model, block size, quota, NIC rates), and takes a node that leaves
out of scheduling: ``draining`` (no new turns; it finishes those it runs, at most
:data:`LEAVE_DRAIN_S`), then ``left`` (what it still held is re-queued).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.core.types import Role
from dualpath_cli.errors import UsageError

__all__ = ["JoinPlan", "JoinService", "LEAVE_DRAIN_S", "NODE_ROLES"]

#: Roles a joining node may take.
NODE_ROLES = (Role.PREFILL.value, Role.DECODE.value)
#: A node's name: one URL path segment (``DELETE /api/v1/join/NAME`` must reach it), a
#: metric label and a word in status lines.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: Engines one node may bring (a GPU each).
MAX_GPUS = 64
#: How long a leaving node's engines may take to finish their turns (state ``draining``)
#: before they are left anyway and the rest re-queued.
LEAVE_DRAIN_S = 30.0


@dataclass(frozen=True)
class JoinPlan:
    """What a joining node needs to start its engines (JSON over the API)."""

    name: str
    node: int
    role: str
    engine_ids: list[int]
    ctl: str
    store: str | None
    model: str
    block_tokens: int
    hbm_blocks: int
    codec: str
    dram_cache_bytes: int
    quota_s: float
    flops_rate: float
    heartbeat_s: float
    fetch_s: float
    snic_bw: float
    cnic_bw: float
    #: the cluster's CURVE key pair (Z85) when its sockets use CURVE: handed to a node
    #: only in the answer to its join, which needs the cluster's token
    curve_public: str | None = None
    curve_secret: str | None = field(default=None, repr=False)  # never in a log or traceback
    #: the cluster's replica roots (storage.replica_roots): POSIX directories every node
    #: mounts at the same paths, like the store; empty from a scheduler without any
    replica_roots: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JoinPlan:
        """Read the API's answer (unknown keys ignored, a missing one is a KeyError; the
        CURVE keys are absent when the cluster does not use CURVE, the replica roots from
        a scheduler that predates them)."""
        optional = ("curve_public", "curve_secret", "replica_roots")
        return cls(**{name: data[name] for name in cls.__dataclass_fields__
                      if name not in optional or name in data})


class JoinService:
    """Places joining nodes into a running system's scheduler. See the module docstring."""

    def __init__(self, system: RuntimeSystem) -> None:
        self.system = system
        self._lock = threading.Lock()
        self._nodes: dict[str, JoinPlan] = {}
        self.joined_at: dict[str, float] = {}
        specs = system.specs
        self._next_node = max((s.node for s in specs), default=-1) + 1
        self._next_eid = max((s.engine_id for s in specs), default=-1) + 1

    def join(self, name: str, role: str, gpus: int) -> JoinPlan:
        """Register node ``name``'s ``gpus`` engines of ``role``; their plan.

        A name whose engines are all dead (it died or left) joins again as a new node; the
        engines it replaces are ``left`` (not counted as unhealthy engines for ever).

        Raises:
            UsageError: a bad role, GPU count or name, or a name still serving.
        """
        if role not in NODE_ROLES:
            raise UsageError(f"role {role!r}: a node is one of {', '.join(NODE_ROLES)}")
        if not 1 <= gpus <= MAX_GPUS:
            raise UsageError(f"gpus {gpus}: a node brings 1 to {MAX_GPUS} engines")
        if not NODE_NAME.fullmatch(name):
            raise UsageError(f"node name {name!r}: 1-64 letters, digits, '.', '_' or '-', "
                             "starting with a letter or digit (it is a URL path segment: "
                             "DELETE /api/v1/join/NAME)")
        sched = self.system.scheduler
        o = self.system.opts
        shaped = self.system.shaped
        curve = self.system.curve
        with self._lock:
            old = self._nodes.get(name)
            if old is not None and any(
                    sched.engines[eid].alive for eid in old.engine_ids if eid in sched.engines):
                raise UsageError(f"node {name!r} is already in the cluster (node "
                                 f"{old.node}); stop it first or choose another --node")
            if old is not None:  # its dead engines are replaced: no longer the cluster's
                for eid in old.engine_ids:
                    sched.mark_dead(eid, "left")
            node = self._next_node
            self._next_node += 1
            eids = list(range(self._next_eid, self._next_eid + gpus))
            self._next_eid += gpus
            for eid in eids:
                sched.register(eid, role, node, node, name)
            plan = JoinPlan(
                name=name, node=node, role=role, engine_ids=eids, ctl=sched.address,
                store=str(o.store_dir) if o.store_dir is not None else None, model=o.model,
                block_tokens=o.block_tokens, hbm_blocks=o.hbm_blocks, codec=o.codec,
                dram_cache_bytes=o.dram_cache_bytes, quota_s=sched.quota_s,
                flops_rate=self.system.flops_rate, heartbeat_s=o.heartbeat_s,
                fetch_s=o.fetch_s, snic_bw=o.snic_bw if shaped else 0.0,
                cnic_bw=o.cnic_bw if shaped else 0.0,
                curve_public=curve.public if curve is not None else None,
                curve_secret=curve.secret if curve is not None else None,
                replica_roots=[str(r) for r in o.replica_dirs])
            self._nodes[name] = plan
            self.joined_at[name] = time.monotonic()
            return plan

    def snapshot(self) -> dict[str, Any]:
        """The placed nodes and the next index and engine id (the scheduler's checkpoint)."""
        with self._lock:
            return {"nodes": [p.to_dict() for p in self._nodes.values()],
                    "next_node": self._next_node, "next_eid": self._next_eid}

    def restore(self, state: dict[str, Any]) -> None:
        """Take back :meth:`snapshot` after a scheduler restart: the nodes keep their names,
        indexes and engine ids (their engines were restored into the scheduler), and new
        nodes get indexes and ids after them."""
        with self._lock:
            for item in state.get("nodes", []):
                plan = JoinPlan.from_dict(item)
                if plan.ctl != self.system.scheduler.address:  # the port could not be kept
                    plan = JoinPlan(**{**plan.to_dict(), "ctl": self.system.scheduler.address})
                self._nodes[plan.name] = plan
                self.joined_at[plan.name] = time.monotonic()
            self._next_node = max(self._next_node, int(state.get("next_node", 0)))
            self._next_eid = max(self._next_eid, int(state.get("next_eid", 0)))

    def _joined(self, name: str) -> JoinPlan:
        """Node ``name``'s plan; a :class:`UsageError` when no node of that name joined."""
        with self._lock:
            plan = self._nodes.get(name)
        if plan is None:
            raise UsageError(f"no node {name!r} joined this cluster")
        return plan

    def leave(self, name: str, drain_s: float = LEAVE_DRAIN_S) -> int:
        """Take node ``name`` out of scheduling: no new turns now, ``left`` once it finished
        its turns (at most ``drain_s``; then the rest are re-queued); engines taken.

        Raises:
            UsageError: no node of that name.
        """
        plan = self._joined(name)
        self.system.scheduler.drain_engines(list(plan.engine_ids), drain_s)
        return len(plan.engine_ids)

    def status(self, name: str) -> dict[str, Any]:
        """Node ``name``'s engines and their states (``starting``, ``ready``, ``draining``,
        ``dead``, ``left``).

        Raises:
            UsageError: no node of that name.
        """
        plan = self._joined(name)
        sched = self.system.scheduler
        known = sched.engine_states()  # one consistent read
        # an engine missing here was not restored (it had not said hello when the
        # scheduler was killed): dead to the node, which then joins again
        states = {eid: known.get(eid, "dead") for eid in plan.engine_ids}
        return {"name": name, "node": plan.node, "role": plan.role,
                "engines": {str(k): v for k, v in states.items()},
                "ready": all(v == "ready" for v in states.values())}
