"""Assemble a running embedded system: store, scheduler service, engines on a cluster.

Why in cluster/ (the launch service) and not in runtime/: it picks the Cluster, Fabric and
store implementations, which is launching, so runtime/ stays a world that imports no
service. Why at all: the bench service, the tests and the ops commands all need "start 1P2D
with this policy on this store, submit turns, collect metrics, stop"; this is that, once.
The store is storage's :class:`~dualpath_cli.storage.PosixStore` (a directory) or its
shipped fake :class:`~dualpath_cli.storage.MemoryStore`; each engine reads through a
StorageLoader whose shaper is its node's storage NIC (one token bucket per node and
direction, shared across the node's engine processes), and sends through its own
compute-NIC bucket.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from dualpath_cli.cluster.emulated import (
    EmulatedCluster,
    EmulationSetup,
    raise_fd_limit,
    raise_socket_limit,
)
from dualpath_cli.cluster.inproc import InProcCluster
from dualpath_cli.cluster.local import EngineFailed, LocalCluster, describe_exits
from dualpath_cli.cluster.supervisor import EngineSupervisor, restart_names
from dualpath_cli.core.groups import group_start
from dualpath_cli.core.layout import BlockShape, Namespace
from dualpath_cli.core.policies import SchedParams, get_policy
from dualpath_cli.core.reference_model import model_config
from dualpath_cli.core.restart_policy import CAP_S, RestartPolicy
from dualpath_cli.errors import ConfigError, DualPathError, UsageError
from dualpath_cli.faultspec import Fault, FaultError
from dualpath_cli.runtime.calibrate import calibrate_flops_rate
from dualpath_cli.runtime.context import EngineSpec
from dualpath_cli.runtime.control import SchedulerChange
from dualpath_cli.runtime.hbm import Compact
from dualpath_cli.runtime.hierarchy import HierarchicalScheduler
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.scheduler import SchedulerService
from dualpath_cli.runtime.scheduler_protocol import Scheduler
from dualpath_cli.runtime.turns import Ticket, TurnRequest
from dualpath_cli.storage import KVStore, MemoryStore, PosixStore, TokenBucket
from dualpath_cli.storage.warm import Warm
from dualpath_cli.telemetry.membership import Membership, build_membership
from dualpath_cli.telemetry.view import ClusterView, Decision, EngineView, NodeView
from dualpath_cli.transfer import InProcFabric, ZmqFabric
from dualpath_cli.transfer.curve import CurveKeys, curve_wanted
from dualpath_cli.transfer.shaping import make_bucket

__all__ = ["RuntimeSystem"]

#: How long ``compact_hbm`` waits for the engine's report before it asks again.
COMPACT_RESEND_S = 2.0


def _curve_keys(opts: RuntimeOptions, emulated: bool) -> CurveKeys | None:
    """The cluster's CURVE key pair when ``cluster.curve`` turns CURVE on for the address
    the fabric binds (its file under the state dir, or a fresh pair), else ``None``.

    Raises:
        ConfigError: CURVE forced on for emulated engines (one machine, loopback only), or
            an unusable key file.
    """
    if not (opts.processes or emulated):
        return None  # threads over queues: no socket to secure
    if not curve_wanted(opts.curve, ZmqFabric().host):
        return None
    if emulated:
        raise ConfigError("cluster.curve on: emulated engines run on this machine's "
                          "loopback and do not speak CURVE; set cluster.curve=auto or off")
    if opts.curve_key_file is None:
        return CurveKeys.generate()
    return CurveKeys.ensure(opts.curve_key_file)


class RuntimeSystem:
    """A started embedded system; use as a context manager.

    Args:
        opts: what to start.
        store: an in-memory store to use (in-process cluster only; tests corrupt it).
    """

    def __init__(self, opts: RuntimeOptions, store: MemoryStore | None = None) -> None:
        policy = get_policy(opts.policy)  # UsageError naming the choices
        self.opts = opts
        cfg = model_config(opts.model)
        self.shape = BlockShape(cfg.n_layers, opts.block_tokens, cfg.kv_bytes_per_token_layer)
        emulated = opts.engines == "emulated"
        # emulated engines persist marker blocks: a namespace real engines never look up
        self.namespace = Namespace(f"emulated-{opts.emulated_model}" if emulated else opts.model,
                                   "layer_major", self.shape, opts.codec)
        self.store: KVStore
        if opts.store_dir is not None:
            self.store = PosixStore(opts.store_dir)
            store_spec: dict[str, Any] = {"kind": "posix", "root": str(opts.store_dir)}
            if opts.replica_dirs:  # copies of hot blocks (storage/replicas.py)
                store_spec["replicas"] = [str(r) for r in opts.replica_dirs]
        else:
            if opts.processes:
                raise UsageError("a process cluster needs a store directory")
            self.store = store if store is not None else MemoryStore()
            store_spec = {"kind": "memory", "obj": self.store}
        self.shaped = policy.shaped
        self.flops_rate = opts.flops_rate or (1e12 if emulated
                                              else calibrate_flops_rate(opts.model))
        if emulated:  # a socket per engine in the scheduler's process
            raise_fd_limit()
            raise_socket_limit()
        self.curve = _curve_keys(opts, emulated)
        self.fabric = (ZmqFabric(curve=self.curve) if opts.processes or emulated
                       else InProcFabric())
        params = SchedParams(alpha=opts.alpha, beta=opts.beta, z_factor=opts.z_factor,
                             block_tokens=opts.block_tokens, seed=opts.random_seed)

        def make_sub(_k: int = 0, log_file: bool = True) -> SchedulerService:
            return SchedulerService(
                self.fabric, self.store, self.namespace, policy.name, params,
                opts.hbm_blocks * opts.block_tokens, heartbeat_timeout=opts.heartbeat_timeout,
                decision_log=opts.decision_log if log_file else None,
                decision_ring=opts.decision_ring, decision_ring_bytes=opts.decision_ring_bytes,
                quota_s=opts.quota_s, sources=opts.sources,
                prefix_cache_tokens=opts.prefix_cache_tokens,
                layerwise_prefill=opts.layerwise_prefill, controllers=opts.controllers,
                control_interval_s=opts.control_interval_s,
                snic_bw=opts.snic_bw if self.shaped else 0.0,
                batch_window_s=opts.batch_window_s)

        self.scheduler: Scheduler
        if opts.hierarchical:
            if not opts.local_engines:
                raise UsageError("scheduler.hierarchical: nodes that join a scheduler-only "
                                 "launch (--join, --backend ray) are not supported with "
                                 "hierarchical scheduling yet; set scheduler.hierarchical="
                                 "false")
            self.scheduler = HierarchicalScheduler(make_sub, *opts.groups(), opts.subs)
        else:
            self.scheduler = make_sub()
        self.cluster: LocalCluster | InProcCluster | EmulatedCluster = (
            EmulatedCluster(EmulationSetup(
                opts.emulated_model, opts.emulated_hardware, opts.prefill_nodes,
                opts.decode_nodes, self.namespace, opts.store_dir, opts.emulated_speed),
                opts.emulated_hosts, self.scheduler.mark_dead) if emulated
            else LocalCluster(self.scheduler.mark_dead) if opts.processes
            else InProcCluster(self.fabric, self.scheduler.mark_dead))
        self.node_nics: dict[int, tuple[TokenBucket, TokenBucket]] = {}
        self.specs = self._specs(store_spec)
        # the launcher as the engines' service manager: a death goes to the scheduler and,
        # with cluster.restart, the engine restarts with backoff (cluster/supervisor.py)
        self.supervisor = EngineSupervisor(
            self.scheduler, self.cluster, self.specs, restart_names(self.specs),
            RestartPolicy(base_s=opts.restart_backoff_s,
                          cap_s=max(opts.restart_backoff_s, CAP_S)),
            enabled=opts.restart)
        self.cluster.on_death = self.supervisor.on_death
        self.started_at = 0.0
        self.closed = False
        self._faults: dict[tuple[str, tuple[str, int]], Fault] = {}
        self._fault_ids = 0  # the last id given to an injected fault

    def _specs(self, store_spec: dict[str, Any]) -> list[EngineSpec]:
        o = self.opts
        snic = o.snic_bw if self.shaped else 0.0  # the oracle crosses no NIC
        cnic = o.cnic_bw if self.shaped else 0.0
        specs: list[EngineSpec] = []
        if not o.local_engines:  # the scheduler alone: nodes join it (cluster/join.py)
            return specs
        eid = 0
        nodes = [("prefill", n) for n in range(o.prefill_nodes)] + [
            ("decode", o.prefill_nodes + n) for n in range(o.decode_nodes)]
        for role, node in nodes:
            shared = o.processes and o.engines == "real"  # emulated: the cost model's NICs
            nics = (make_bucket(snic, shared), make_bucket(snic, shared))
            self.node_nics[node] = nics
            # a group is cluster.nodes_per_group consecutive nodes of the role, named by its
            # first node, whose first engine leads it (core/groups.py)
            first = 0 if role == "prefill" else o.prefill_nodes
            group = first + group_start(node - first, o.nodes_per_group)
            for gpu in range(o.gpus_per_node):
                specs.append(EngineSpec(
                    engine_id=eid, role=role, node=node, group=group,
                    leader=gpu == 0 and node == group,
                    ctl=self._ctl(role, group), snic_read=nics[0], snic_write=nics[1],
                    cnic=make_bucket(cnic, shared), hbm_blocks=o.hbm_blocks,
                    block_tokens=o.block_tokens, model=o.model, store=store_spec,
                    codec=o.codec, dram_cache_bytes=o.dram_cache_bytes, quota_s=o.quota_s,
                    flops_rate=self.flops_rate, heartbeat_s=o.heartbeat_s, fetch_s=o.fetch_s,
                    curve=self.curve))
                # named as the operator stories and diagnose name a launch's nodes (P0, D1:
                # the role's letter and the node index, which --inject node=N targets)
                self.scheduler.register(eid, role, node, group, f"{role[0].upper()}{node}")
                eid += 1
        return specs

    def _ctl(self, role: str, group: int) -> str:
        """The scheduler endpoint ``role``'s group ``group`` talks to (its sub's, when
        hierarchical)."""
        return self.scheduler.address_for(role, group)

    def _owner(self, engine_id: int) -> SchedulerService:
        """The (sub-)scheduler that serves engine ``engine_id``.

        Raises:
            UsageError: an engine no sub knows (hierarchical).
        """
        return self.scheduler.owner(engine_id)


    def __enter__(self) -> RuntimeSystem:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, timeout: float = 60.0) -> None:
        """Start the scheduler and the engines; wait until all engines said hello.

        An engine that exits meanwhile ends the wait at once (:class:`EngineFailed`, one
        line), and so does the timeout; either way what was started is stopped first.
        """
        self.scheduler.start()
        try:
            self.cluster.start(self.specs)
            deadline = time.monotonic() + timeout
            while True:
                try:
                    self.scheduler.wait_ready(min(0.25, max(0.0, deadline - time.monotonic())))
                    break
                except TimeoutError:
                    dead = self.cluster.exited()
                    if dead:
                        raise EngineFailed(f"{describe_exits(dead)} exited during start-up; "
                                           "see its messages above") from None
                    if time.monotonic() >= deadline:
                        raise EngineFailed(f"the engines did not start within {timeout:g} s"
                                           ) from None
            # an engine that died before its hello is no longer waited for (the scheduler
            # skips dead engines), but a start with one dead is a failed start
            dead = self.cluster.exited()
            if dead:
                raise EngineFailed(f"{describe_exits(dead)} exited during start-up; "
                                   "see its messages above")
            if isinstance(self.cluster, LocalCluster):  # every engine has opened the buckets
                self.cluster.wait_unlinked(max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.close()
            raise
        self.started_at = time.monotonic()
        self.supervisor.arm()

    def down(self) -> dict[int, int]:
        """Engines down for good, with exit codes: exited and not coming back (no restart
        due or under way: ``cluster.restart`` off, a crash loop, or a cluster that cannot
        restart engines). What a run or a live cluster judges lost roles by."""
        coming = self.supervisor.restarting()
        return {eid: code for eid, code in self.cluster.exited().items()
                if eid not in coming}

    def submit(self, req: TurnRequest) -> Ticket:
        """Submit one turn."""
        return self.scheduler.submit(req)

    def engine_ids(self, role: str) -> list[int]:
        """Engine ids of ``role``."""
        return [s.engine_id for s in self.specs if s.role == role]

    def metrics(self, fresh: bool = True, timeout: float = 5.0) -> dict[int, dict[str, Any]]:
        """Every engine's metrics snapshot by engine id (see ``SchedulerService.metrics``).

        The live cluster's ``/metrics`` serves these (as last heartbeated), and
        ``dualpath-monitor`` reads that: names and labels are those of the metrics table
        (:mod:`dualpath_cli.telemetry.metrics`).
        """
        return self.scheduler.metrics(fresh=fresh, timeout=timeout)

    def metric_frames(self) -> dict[int, dict[str, Any]]:
        """Every engine's last metrics frame (``SchedulerService.metric_frames``)."""
        return self.scheduler.metric_frames()

    def view(self) -> ClusterView:
        """A typed, immutable snapshot of the whole system (the read model).

        ``state`` is ``starting`` until every engine has said hello, then ``ready``, and
        ``stopped`` after :meth:`close` (a live service that drains says ``draining`` itself,
        with ``dataclasses.replace``). Values not reported yet are ``None``.
        """
        o = self.opts
        engines, nodes, sched = self.scheduler.view_parts(
            o.snic_bw if self.shaped else 0.0, o.cnic_bw if self.shaped else 0.0)
        if self.closed:
            state = "stopped"
        else:
            state = "ready" if self.scheduler.all_hello() and self.started_at else "starting"
        uptime = time.monotonic() - self.started_at if self.started_at else 0.0
        nodes = self._throttled(nodes)
        members = self.membership(engines)
        return ClusterView(time.time(), state, members.of, o.model, uptime, engines, nodes,
                           sched, members)

    def membership(self, engines: tuple[EngineView, ...]) -> Membership:
        """The one membership record (telemetry/membership.py) of ``engines``: what was
        configured is the launch's ``--pd``, or, for joined nodes, the names that joined
        (a node removed before its hello was never the cluster's)."""
        o = self.opts
        rows = [(e.node_name or f"node {e.node}", e.node, e.role, e.state,
                 e.heartbeat_age_s is not None) for e in engines]
        gaps = self.scheduler.role_gap_list()
        if o.local_engines:
            return build_membership(rows, {"prefill": o.prefill_nodes,
                                           "decode": o.decode_nodes}, gaps,
                                    supervision=self.supervisor.by_node(),
                                    down=self.supervisor.down_by_node())
        first = build_membership(rows, {}, gaps)
        names: dict[str, set[str]] = {"prefill": set(), "decode": set()}
        for n in first.nodes:
            if n.said_hello or n.state != "left":
                names.setdefault(n.role, set()).add(n.name)
        return build_membership(rows, {r: len(v) for r, v in names.items()}, gaps)

    def _throttled(self, nodes: tuple[NodeView, ...]) -> tuple[NodeView, ...]:
        """A throttled node's storage NIC runs at its bucket's lowered rate: report that rate
        as the node's bandwidth, and the utilisation against it (what a NIC negotiated down
        to a lower speed shows)."""
        frac = {f.node: f.fraction for f in self._faults.values() if f.kind == "snic_throttle"}
        if not frac:
            return nodes
        out = []
        for n in nodes:
            f = frac.get(n.node)
            if f is not None and n.snic_bandwidth_bytes_per_s:
                util = n.snic_utilization
                n = dataclasses.replace(
                    n, snic_bandwidth_bytes_per_s=n.snic_bandwidth_bytes_per_s * f,
                    snic_utilization=None if util is None else min(1.0, util / f))
            out.append(n)
        return tuple(out)

    def decisions(self, since: int = -1) -> list[Decision]:
        """Logged decisions with ``seq > since``, oldest first (the ring keeps the last
        ``RuntimeOptions.decision_ring``)."""
        return self.scheduler.decisions(since)

    def update_scheduler(self, change: SchedulerChange) -> tuple[dict[str, Any],
                                                                 dict[str, Any]]:
        """Change alpha, beta, the PE quota or the read side of the running scheduler.

        Returns ``(old, new)`` of the fields ``change`` sets; later decisions use the new
        values (their inputs say so) and the thresholds' source becomes ``api``.

        Raises:
            UsageError: nothing to change or a bad value, with the reason.
        """
        return self.scheduler.update(change)

    # -- fault injection ------------------------------------------------------------------
    @property
    def faults(self) -> list[Fault]:
        """The injected faults in force, in the order they were set."""
        return list(self._faults.values())

    def _engine_nodes(self) -> dict[int, int]:
        """Engine id -> node of every engine the scheduler knows: its own engines and those
        of nodes that joined it (a scheduler-only launch has no local specs)."""
        out: dict[int, int] = {}
        for sched in self.scheduler.schedulers():
            out.update({eid: e.node for eid, e in sched.consistent_engines().items()})
        return out

    def _check_fault(self, f: Fault) -> None:
        key, value = f.target
        nodes = self._engine_nodes()
        known = sorted(set(nodes.values()) if key == "node" else set(nodes))
        if value not in known:
            has = f"{key}s {known[0]}-{known[-1]}" if known else f"no {key}s yet"
            raise FaultError(f"fault {f.kind}: {key} {value} does not exist (this cluster has "
                             f"{has})")
        if f.kind == "snic_throttle" and not (self.shaped and self.opts.snic_bw > 0):
            raise FaultError(f"fault {f.kind}: the storage NICs are not shaped (policy "
                             f"{self.opts.policy!r}, snic_bw {self.opts.snic_bw:g}); a "
                             "fraction of an unshaped NIC means nothing")

    def _fault_targets(self, f: Fault) -> list[int]:
        """Engines that apply ``f``: its engine, or every engine of its node (only the
        node's first engine drives a hot-blocks fault: one read stream per node)."""
        if f.target[0] == "engine":
            return [f.engine]
        ids = sorted(eid for eid, node in self._engine_nodes().items() if node == f.node)
        return ids[:1] if f.kind == "hot_blocks" else ids

    def _send_fault(self, f: Fault) -> None:
        for eid in self._fault_targets(f):
            self._owner(eid).send_to_engine(eid, f)

    def set_faults(self, faults: Sequence[Fault]) -> tuple[list[dict[str, Any]],
                                                           list[dict[str, Any]]]:
        """Inject ``faults`` (one of a kind and target replaces the one in force) on the
        engines they target; returns the active faults before and after, as dicts.

        Raises:
            FaultError: no faults, or a target this cluster lacks (nothing is applied).
        """
        if not faults:
            raise FaultError("no faults given; expected at least one SPEC")
        for f in faults:
            self._check_fault(f)
        old = [f.to_dict() for f in self._faults.values()]
        for f in faults:
            self._fault_ids += 1
            f = dataclasses.replace(f, id=self._fault_ids, since=time.time())
            self._faults.pop((f.kind, f.target), None)  # a replaced one is listed as new
            self._faults[f.kind, f.target] = f
            self._send_fault(f)
        self._scale_nics()
        return old, [f.to_dict() for f in self._faults.values()]

    def _scale_nics(self) -> None:
        """Tell the scheduler which storage NICs a throttle slowed (alpha's controller
        measures utilisation against the rate a NIC runs at)."""
        scale = {f.node: f.fraction for f in self._faults.values()
                 if f.kind == "snic_throttle"}
        for sched in self.scheduler.schedulers():
            sched.set_snic_scale(scale)

    # -- remedies ---------------------------------------------------------------------
    def compact_hbm(self, engine_id: int, timeout: float = 10.0,
                    resend_s: float = COMPACT_RESEND_S) -> tuple[dict[str, Any],
                                                                 dict[str, Any]]:
        """Defragment engine ``engine_id``'s HBM pool and wait until it reports the result.

        Returns its HBM facts before and after (fragmentation score, largest free run and
        free blocks, from the heartbeats on either side of the compaction).

        Raises:
            UsageError: no such engine, or it is not serving (starting, dead).
            DualPathError: the engine did not report the compaction within ``timeout``.
        """
        ids = sorted(self._engine_nodes())
        if engine_id not in ids:
            raise UsageError(f"no engine {engine_id} (this cluster has engines "
                             f"{ids[0]}-{ids[-1]})")
        sched = self._owner(engine_id)
        e = sched.consistent_engines().get(engine_id)
        if e is None:
            raise UsageError(f"no engine {engine_id} (this cluster has engines "
                             f"{ids[0]}-{ids[-1]})")
        before = e.hb
        if before is None or not (e.alive and e.address):
            raise UsageError(f"engine {engine_id} is {e.state}, not serving: nothing to "
                             "compact")
        # a Compact dropped on the way (a loaded host: the engine took no message within
        # the send timeout) or lost with its heartbeat is sent again: compacting twice is
        # harmless, and any heartbeat counting one more compaction answers
        deadline = time.monotonic() + timeout
        after, sends, dropped = None, 0, 0
        while after is None and time.monotonic() < deadline:
            sends += 1
            if not sched.send_to_engine(engine_id, Compact(engine_id)):
                dropped += 1
            wait = min(resend_s, deadline - time.monotonic())
            after = sched.wait_heartbeat(
                engine_id, lambda hb: hb.compactions > before.compactions, max(wait, 0.0))
            if after is None and not sched.consistent_engines().get(engine_id, e).alive:
                break
        if after is None:
            raise DualPathError(f"engine {engine_id} did not report its HBM "
                                f"compaction within {timeout:g} s ({sends} requests sent, "
                                f"{dropped} dropped by the transport)")

        def facts(hb: Any) -> dict[str, Any]:
            return {"engine": engine_id, "hbm_fragmentation": round(hb.hbm_fragmentation, 4),
                    "hbm_largest_free_blocks": hb.hbm_largest_free_run,
                    "hbm_free_blocks": hb.hbm_free_blocks}

        return facts(before), facts(after)

    # -- warm-up (seed 8.3) ------------------------------------------------------------
    def warm(self, keys: Sequence[str], rate_bps: float, role: str = "all") -> list[int]:
        """Send every serving engine of ``role`` (``all``, ``prefill``, ``decode``) a warm-up
        of ``keys`` (hex); a node's cap ``rate_bps`` is shared evenly by its targeted
        engines (they share its storage NIC). A new warm-up replaces one in progress; no
        keys stops it. Returns the engines sent to.

        Raises:
            UsageError: a bad role or rate, emulated engines, or no DRAM cache to warm.
        """
        if role not in ("all", "prefill", "decode"):
            raise UsageError(f"warm-up role {role!r}: expected all, prefill or decode")
        if self.opts.engines != "real":
            raise UsageError("warm-up needs real engines: emulated engines keep no DRAM "
                             "cache of KV blocks")
        if self.opts.dram_cache_bytes <= 0 and keys:
            raise UsageError("the engines have no DRAM cache (dram_cache_bytes 0): nothing "
                             "to warm into")
        if not rate_bps > 0:
            raise UsageError(f"warm-up rate must be more than 0 bytes/s, got {rate_bps!r}")
        targets = [s for s in self.specs if role == "all" or s.role == role]
        per_node: dict[int, int] = {}
        for spec in targets:
            per_node[spec.node] = per_node.get(spec.node, 0) + 1
        sent: list[int] = []
        for spec in targets:
            sched = self._owner(spec.engine_id)
            if sched.send_to_engine(spec.engine_id,
                                    Warm(tuple(keys), rate_bps / per_node[spec.node])):
                sent.append(spec.engine_id)
        return sent

    def clear_faults(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Undo every injected fault; returns the active faults before and after (empty)."""
        old = [f.to_dict() for f in self._faults.values()]
        for f in list(self._faults.values()):
            self._send_fault(dataclasses.replace(f, on=False))
        self._faults.clear()
        self._scale_nics()
        return old, []

    def clear_fault(self, fault_id: int) -> tuple[list[dict[str, Any]],
                                                  list[dict[str, Any]]]:
        """Undo the one fault numbered ``fault_id``; returns the active faults before and
        after.

        Raises:
            FaultError: no fault in force has that id (nothing changes).
        """
        found = [key for key, f in self._faults.items() if f.id == fault_id]
        if not found:
            ids = ", ".join(f"#{f.id}" for f in self._faults.values()) or "none"
            raise FaultError(f"no fault #{fault_id} in force (in force: {ids})")
        old = [f.to_dict() for f in self._faults.values()]
        self._send_fault(dataclasses.replace(self._faults.pop(found[0]), on=False))
        self._scale_nics()
        return old, [f.to_dict() for f in self._faults.values()]

    def close(self) -> None:
        """Stop engines and the scheduler."""
        self.closed = True
        self.supervisor.stop()
        self.scheduler.stop()
        self.cluster.shutdown()
