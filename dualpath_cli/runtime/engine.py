"""One engine (an emulated GPU): its mailbox loop, heartbeats and group fetches.

The same :func:`run_engine` body runs in a child process (local cluster, ZeroMQ) or in a
thread (in-process fake cluster, queue fabric). Every ``heartbeat_s`` it sends a
:class:`~dualpath_cli.runtime.wire.Heartbeat`: counters, HBM use (largest free run,
fragmentation), per-layer hits by tier, NIC bytes, busy time, the quota in force, the node
loader's read queue in tokens (``rq``) with the last dispatch it has submitted (``seen``),
and every ``metrics_s`` the engine's whole metrics snapshot. A ``quota`` message changes the
PE's compute quota while it runs; a ``fault`` message turns an injected fault on or off
(:mod:`~dualpath_cli.runtime.faults`); a ``compact`` message defragments its HBM pool.
Every message is a typed record of :mod:`~dualpath_cli.runtime.wire`. A group leader also
sends a ``fetch`` every ``fetch_s`` (the paper's pull-based scheduling, section 6.1), and
carries on it its group's read-queue reports: once the scheduler names the leader
(``leader``), a member sends its reports there instead of to the scheduler.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from dualpath_cli.core.layout import BlockKey
from dualpath_cli.faultspec import Fault
from dualpath_cli.runtime.context import EngineContext, EngineSpec, open_store
from dualpath_cli.runtime.decode import DecodeWorker
from dualpath_cli.runtime.faults import FaultInjector
from dualpath_cli.runtime.hbm import Compact
from dualpath_cli.runtime.ports import ModelPort
from dualpath_cli.runtime.prefill import PrefillWorker
from dualpath_cli.runtime.wire import (
    GroupLeader,
    Hello,
    Lead,
    MetricsRequest,
    QueueReport,
    SetQuota,
    Stop,
    WireError,
    decode,
)
from dualpath_cli.storage.header import file_nbytes
from dualpath_cli.storage.warm import Warm, Warmer
from dualpath_cli.telemetry.registry import MetricsRegistry
from dualpath_cli.transfer.base import Fabric

__all__ = ["run_engine"]

log = logging.getLogger(__name__)


def run_engine(spec: EngineSpec, fabric: Fabric, model_factory: Callable[[str], ModelPort],
               stop: threading.Event | Any | None = None) -> None:
    """Serve as engine ``spec`` until ``stop`` is set or the scheduler says ``stop``."""
    model = model_factory(spec.model)
    ep = fabric.endpoint(f"engine{spec.engine_id}")
    registry = MetricsRegistry()
    ctx = EngineContext(spec, ep, model, open_store(spec.store, registry), registry)
    worker: PrefillWorker | DecodeWorker
    worker = PrefillWorker(ctx) if spec.role == "prefill" else DecodeWorker(ctx)
    faults = FaultInjector(ctx)
    warmer: Warmer | None = None
    ctx.to_ctl(Hello(spec.engine_id, ep.address, spec.role, spec.node, spec.group,
                     os.getpid()))
    next_hb = next_fetch = next_metrics = 0.0
    try:
        while stop is None or not stop.is_set():
            now = time.monotonic()
            if now >= next_hb:
                with_metrics = now >= next_metrics
                ctx.heartbeat(worker.jobs_in_hand(), with_metrics)
                if with_metrics:
                    next_metrics = now + spec.metrics_s
                next_hb = now + spec.heartbeat_s
            if spec.leader and now >= next_fetch:
                ctx.to_ctl(ctx.fetch())  # with the group's queue reports
                next_fetch = now + spec.fetch_s
            wait = min(next_hb, next_fetch if spec.leader else next_hb) - time.monotonic()
            raw = ep.recv(timeout=max(wait, 0.0))
            if raw is None:
                continue
            try:
                msg = decode(raw.header, raw.buffers)
            except WireError as err:
                log.warning("engine %d: dropped a message: %s", spec.engine_id, err)
                continue
            if isinstance(msg, Stop):
                break
            if isinstance(msg, MetricsRequest):  # a fresh snapshot on demand (metrics(fresh=True))
                ctx.heartbeat(worker.jobs_in_hand(), True)
                continue
            if isinstance(msg, Lead):  # the group's leader died: fetch for it from now on
                if not spec.leader:
                    log.warning("engine %d: leads group %d (its leader died)",
                                spec.engine_id, msg.group)
                spec.leader, next_fetch = True, 0.0
                continue
            if isinstance(msg, QueueReport):  # a member's, for this leader's next fetch
                ctx.keep_report(msg)
                continue
            if isinstance(msg, GroupLeader):
                ctx.report_to = msg.addr if msg.addr != ep.address else ""
                continue
            if isinstance(msg, SetQuota):
                spec.quota_s = msg.quota_s  # the PE's batcher reads it before every batch
                ctx.heartbeat(worker.jobs_in_hand(), False)  # show the new quota at once
                continue
            if isinstance(msg, Fault):
                faults.apply(msg)
                ctx.heartbeat(worker.jobs_in_hand(), True)  # show its effect (HBM) at once
                continue
            if isinstance(msg, Warm):  # a new warm-up replaces the one in progress
                if warmer is not None:
                    warmer.stop()
                warmer = _warm(ctx, msg)
                continue
            if isinstance(msg, Compact):
                moved = ctx.compact_hbm()
                log.info("engine %d: HBM compacted on request (%d blocks moved)",
                         spec.engine_id, moved)
                ctx.heartbeat(worker.jobs_in_hand(), True)  # the caller waits for this one
                continue
            worker.handle(msg)
    finally:
        if warmer is not None:
            warmer.stop()
        faults.clear()
        worker.close()
        ctx.close()
        ep.close()


def _warm(ctx: EngineContext, msg: Warm) -> Warmer | None:
    """Start warming this engine's DRAM cache with ``msg.keys`` (None: nothing to warm)."""
    if not msg.keys or ctx.loader.cache.capacity_bytes <= 0 or not msg.rate_bps > 0:
        ctx.registry.gauge("dualpath_storage_warm_blocks_remaining",
                           node=ctx.loader.node).set(0)
        return None
    keys = [BlockKey.from_hex(k) for k in msg.keys]
    block = file_nbytes(ctx.n_layers * ctx.bt * ctx.bpl)
    return Warmer(ctx.loader, keys, msg.rate_bps, block_nbytes=block,
                  registry=ctx.registry).start()
