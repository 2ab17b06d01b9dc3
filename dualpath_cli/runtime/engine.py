"""One engine (an emulated GPU): its mailbox loop, heartbeats and group fetches.

The same :func:`run_engine` body runs in a child process (local cluster, ZeroMQ) or in a
thread (in-process fake cluster, queue fabric). Every ``heartbeat_s`` it reports to the
scheduler: counters, HBM free tokens and fragmentation, the node loader's read queue in
tokens (``rq``) with the last dispatch it has submitted (``seen``), and every ``metrics_s``
the engine's whole metrics snapshot. A group leader also sends a ``fetch`` every ``fetch_s``
(the paper's pull-based scheduling, section 6.1).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from dualpath_cli.runtime.context import EngineContext, EngineSpec, open_store
from dualpath_cli.runtime.decode import DecodeWorker
from dualpath_cli.runtime.ports import ModelPort
from dualpath_cli.runtime.prefill import PrefillWorker
from dualpath_cli.telemetry.registry import MetricsRegistry
from dualpath_cli.transfer.base import Fabric

__all__ = ["run_engine"]


def run_engine(spec: EngineSpec, fabric: Fabric, model_factory: Callable[[str], ModelPort],
               stop: threading.Event | Any | None = None) -> None:
    """Serve as engine ``spec`` until ``stop`` is set or the scheduler says ``stop``."""
    model = model_factory(spec.model)
    ep = fabric.endpoint(f"engine{spec.engine_id}")
    registry = MetricsRegistry()
    ctx = EngineContext(spec, ep, model, open_store(spec.store, registry), registry)
    worker: PrefillWorker | DecodeWorker
    worker = PrefillWorker(ctx) if spec.role == "prefill" else DecodeWorker(ctx)
    ctx.to_ctl({"t": "hello", "addr": ep.address, "role": spec.role, "node": spec.node,
                "group": spec.group, "pid": os.getpid()})
    next_hb = next_fetch = next_metrics = 0.0
    try:
        while stop is None or not stop.is_set():
            now = time.monotonic()
            if now >= next_hb:
                report: dict[str, Any] = {"t": "hb", **ctx.counters.snapshot(),
                                          **worker.report(), "hbm": ctx.hbm.stats().usage}
                if now >= next_metrics:
                    ctx.refresh_gauges()
                    report["metrics"] = ctx.registry.snapshot()
                    next_metrics = now + spec.metrics_s
                ctx.report_queue(report)
                next_hb = now + spec.heartbeat_s
            if spec.leader and now >= next_fetch:
                ctx.to_ctl({"t": "fetch", "group": spec.group, "role": spec.role})
                next_fetch = now + spec.fetch_s
            wait = min(next_hb, next_fetch if spec.leader else next_hb) - time.monotonic()
            msg = ep.recv(timeout=max(wait, 0.0))
            if msg is None:
                continue
            if msg.kind == "stop":
                break
            if msg.kind == "metrics":  # a fresh snapshot on demand (monitor, bench end)
                ctx.refresh_gauges()
                ctx.report_queue({"t": "hb", **ctx.counters.snapshot(), **worker.report(),
                                  "hbm": ctx.hbm.stats().usage,
                                  "metrics": ctx.registry.snapshot()})
                continue
            worker.handle(msg)
    finally:
        worker.close()
        ctx.close()
        ep.close()
