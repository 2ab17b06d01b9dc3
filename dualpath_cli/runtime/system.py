"""Assemble a running embedded system: store, scheduler service, engines on a cluster.

Why here: the bench service, the tests and (later) the ops commands all need "start 1P2D with
this policy on this store, submit turns, collect metrics, stop"; this is that, once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualpath_cli.cluster.inproc import InProcCluster
from dualpath_cli.cluster.local import LocalCluster
from dualpath_cli.core.layout import BlockShape, Namespace
from dualpath_cli.core.policies import SchedParams
from dualpath_cli.runtime.blockstore import DirBlockStore, MemoryBlockStore
from dualpath_cli.runtime.context import EngineSpec
from dualpath_cli.runtime.model import model_config
from dualpath_cli.runtime.nic import Link
from dualpath_cli.runtime.scheduler import SchedulerService, Ticket, TurnRequest
from dualpath_cli.transfer import InProcFabric, ZmqFabric

__all__ = ["RuntimeOptions", "RuntimeSystem"]


@dataclass
class RuntimeOptions:
    """Shape and knobs of one embedded run (base units: bytes/s, tokens, seconds).

    Args:
        prefill_nodes / decode_nodes: the P/D spec (1P2D by default).
        gpus_per_node: engines per node (they share the node's storage NIC).
        model: reference-model profile name.
        block_tokens: KV block size in tokens.
        snic_bw: storage-NIC bandwidth per node, each direction (<= 0: unshaped).
        cnic_bw: compute-NIC bandwidth per engine (<= 0: unshaped).
        hbm_blocks: HBM capacity per engine, in blocks.
        policy: runtime policy (dualpath, basic, round-robin, random, split, oracle).
        store_dir: block directory (None: in-memory store, in-process cluster only).
        processes: one process per engine over ZeroMQ (False: threads over queues).
        alpha / beta: scheduler thresholds in tokens.
        heartbeat_timeout: seconds of silence before an engine is declared dead.
        decision_log: JSONL file for scheduler decisions.
    """

    prefill_nodes: int = 1
    decode_nodes: int = 2
    gpus_per_node: int = 1
    model: str = "tiny"
    block_tokens: int = 16
    snic_bw: float = 0.0
    cnic_bw: float = 0.0
    hbm_blocks: int = 4096
    policy: str = "dualpath"
    store_dir: Path | None = None
    processes: bool = False
    alpha: int = 10**9
    beta: int = 10**9
    heartbeat_timeout: float = 1.0
    decision_log: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class RuntimeSystem:
    """A started embedded system; use as a context manager."""

    def __init__(self, opts: RuntimeOptions, store: MemoryBlockStore | None = None) -> None:
        self.opts = opts
        cfg = model_config(opts.model)
        self.shape = BlockShape(cfg.n_layers, opts.block_tokens, cfg.kv_bytes_per_token_layer)
        self.namespace = Namespace(opts.model, "layer_major", self.shape)
        full = (cfg.n_layers, opts.block_tokens, cfg.kv_bytes_per_token_layer)
        self.store: MemoryBlockStore | DirBlockStore
        if opts.store_dir is not None:
            self.store = DirBlockStore(opts.store_dir, full)
            store_spec: dict[str, Any] = {"kind": "dir", "root": str(opts.store_dir)}
        else:
            if opts.processes:
                raise ValueError("a process cluster needs a store directory")
            self.store = store if store is not None else MemoryBlockStore(full)
            store_spec = {"kind": "memory", "obj": self.store}
        self.fabric = ZmqFabric() if opts.processes else InProcFabric()
        params = SchedParams(alpha=opts.alpha, beta=opts.beta, block_tokens=opts.block_tokens)
        self.scheduler = SchedulerService(
            self.fabric, self.store, self.namespace, opts.policy, params,
            opts.hbm_blocks * opts.block_tokens, heartbeat_timeout=opts.heartbeat_timeout,
            decision_log=opts.decision_log)
        self.cluster: LocalCluster | InProcCluster = (
            LocalCluster(self.scheduler.mark_dead) if opts.processes
            else InProcCluster(self.fabric, self.scheduler.mark_dead))
        self.specs = self._specs(store_spec)
        self.snics: dict[int, Link] = {}
        self.started_at = 0.0

    def _specs(self, store_spec: dict[str, Any]) -> list[EngineSpec]:
        o = self.opts
        specs: list[EngineSpec] = []
        eid = 0
        shared = o.processes
        nodes = [("prefill", n) for n in range(o.prefill_nodes)] + [
            ("decode", o.prefill_nodes + n) for n in range(o.decode_nodes)]
        self.node_links: dict[int, tuple[Link, Link]] = {}
        for role, node in nodes:
            links = (Link(f"snic{node}-rd", o.snic_bw, shared=shared),
                     Link(f"snic{node}-wr", o.snic_bw, shared=shared))
            self.node_links[node] = links
            for gpu in range(o.gpus_per_node):
                specs.append(EngineSpec(
                    engine_id=eid, role=role, node=node, group=node, leader=gpu == 0,
                    ctl=self.scheduler.address, snic_read=links[0], snic_write=links[1],
                    cnic=Link(f"cnic{eid}", o.cnic_bw, shared=shared),
                    hbm_blocks=o.hbm_blocks, block_tokens=o.block_tokens, model=o.model,
                    store=store_spec))
                self.scheduler.register(eid, role, node, node)
                eid += 1
        return specs

    def __enter__(self) -> RuntimeSystem:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, timeout: float = 60.0) -> None:
        """Start the scheduler and the engines; wait until all engines said hello."""
        self.scheduler.start()
        self.cluster.start(self.specs)
        self.scheduler.wait_ready(timeout)
        self.started_at = time.monotonic()

    def submit(self, req: TurnRequest) -> Ticket:
        """Submit one turn."""
        return self.scheduler.submit(req)

    def engine_ids(self, role: str) -> list[int]:
        """Engine ids of ``role``."""
        return [s.engine_id for s in self.specs if s.role == role]

    def close(self) -> None:
        """Stop engines and the scheduler."""
        self.scheduler.stop()
        self.cluster.shutdown()
