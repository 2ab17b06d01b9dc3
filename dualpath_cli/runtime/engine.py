"""One engine (an emulated GPU): its mailbox loop, heartbeats and group fetches.

The same :func:`run_engine` body runs in a child process (local cluster, ZeroMQ) or in a
thread (in-process fake cluster, queue fabric). Every ``heartbeat_s`` it reports to the
scheduler (counters, HBM free tokens, fragmentation); a group leader also sends a ``fetch``
every ``fetch_s`` (the paper's pull-based scheduling, section 6.1).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from dualpath_cli.core.layout import BlockShape, Namespace
from dualpath_cli.runtime.blockstore import open_store
from dualpath_cli.runtime.context import EngineContext, EngineSpec
from dualpath_cli.runtime.decode import DecodeWorker
from dualpath_cli.runtime.ports import ModelPort
from dualpath_cli.runtime.prefill import PrefillWorker
from dualpath_cli.transfer.base import Fabric

__all__ = ["run_engine", "make_namespace", "limit_blas_threads"]


def limit_blas_threads() -> None:
    """One BLAS thread per engine: engines are the parallelism, not BLAS."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def make_namespace(model_name: str, model: ModelPort, block_tokens: int) -> Namespace:
    """The prefix-key namespace of ``model`` with ``block_tokens``-token blocks."""
    shape = BlockShape(model.n_layers, block_tokens, model.kv_bytes_per_token_layer)
    return Namespace(model_name, "layer_major", shape)


def run_engine(spec: EngineSpec, fabric: Fabric, model_factory: Callable[[str], ModelPort],
               stop: threading.Event | Any | None = None) -> None:
    """Serve as engine ``spec`` until ``stop`` is set or the scheduler says ``stop``."""
    model = model_factory(spec.model)
    ep = fabric.endpoint(f"engine{spec.engine_id}")
    store = open_store(spec.store, (model.n_layers, spec.block_tokens,
                                    model.kv_bytes_per_token_layer))
    ctx = EngineContext(spec, ep, model, store)
    worker: PrefillWorker | DecodeWorker
    if spec.role == "prefill":
        worker = PrefillWorker(ctx)
    else:
        worker = DecodeWorker(ctx, make_namespace(spec.model, model, spec.block_tokens))
    ctx.to_ctl({"t": "hello", "addr": ep.address, "role": spec.role, "node": spec.node,
                "group": spec.group, "pid": os.getpid()})
    next_hb = next_fetch = 0.0
    try:
        while stop is None or not stop.is_set():
            now = time.monotonic()
            if now >= next_hb:
                report = {"t": "hb", **ctx.counters.snapshot(), **worker.report(),
                          "hbm": ctx.hbm.stats().usage}
                ctx.to_ctl(report)
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
            worker.handle(msg)
    finally:
        worker.close()
        ctx.close()
        ep.close()
