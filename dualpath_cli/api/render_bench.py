"""Time the two renders a scrape pays for: ``/metrics`` text and ``/api/v1/metrics`` JSON.

Why in the package: bench/metrics_render.py prints the table and bench/api.py (the API
benchmark) reports the same keys, so both call :func:`measure_renders` on one synthetic
cluster. The synthetic cluster is the paper's largest, 48P96D with 8 GPUs per node (1,152
engines), with every field of the view filled and every engine carrying a registry snapshot
of the families a real engine records (loader, HBM, NICs, per-layer hits and bubbles), so the
timing covers what a live scrape renders.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from dualpath_cli.telemetry.exposition import render_prometheus
from dualpath_cli.telemetry.gpu import FakeGpuBackend, GpuDevice
from dualpath_cli.telemetry.host import host_facts
from dualpath_cli.telemetry.registry import MetricsRegistry
from dualpath_cli.telemetry.view import (
    ClusterView,
    DecisionCounts,
    EngineView,
    LayerHits,
    NodeView,
    SchedulerView,
    Thresholds,
)

__all__ = ["synthetic_view", "synthetic_engine_metrics", "engine_registry", "measure_renders"]


def synthetic_view(prefill_nodes: int = 48, decode_nodes: int = 96, gpus_per_node: int = 8,
                   layers: int = 4, at: float = 1.0e9) -> ClusterView:
    """A fully populated view of ``prefill_nodes``P``decode_nodes``D x ``gpus_per_node``."""
    engines: list[EngineView] = []
    nodes: list[NodeView] = []
    eid = 0
    for node in range(prefill_nodes + decode_nodes):
        role = "prefill" if node < prefill_nodes else "decode"
        ids = []
        for gpu in range(gpus_per_node):
            ids.append(eid)
            engines.append(EngineView(
                engine_id=eid, role=role, node=node, group=node, state="ready",
                pid=10_000 + eid, seq=eid % 7, tokens=1000 * (eid % 13),
                read_queue_tokens=64 * gpu, read_queue_bytes=4096 * gpu,
                hbm_used_bytes=2**30 + eid, hbm_free_bytes=2**33 - eid,
                hbm_fragmentation=0.125, hbm_largest_free_blocks=4000 - gpu,
                nic_bytes={"snic_read": 10**9 + eid, "snic_write": 10**6, "cnic_tx": 5 * 10**8,
                           "cnic_rx": 4 * 10**8},
                layers=tuple(LayerHits(layer, dram=eid, store=2 * eid, peer=3, slack_s=0.001)
                             for layer in range(layers)),
                gpu_utilization=0.5 + 0.001 * gpu, heartbeat_age_s=0.02))
            eid += 1
        nodes.append(NodeView(node=node, role=role, engines=tuple(ids), snic_utilization=0.4,
                              cnic_utilization=0.2, snic_bandwidth_bytes_per_s=5e10,
                              read_queue_tokens=512, read_queue_bytes=2**20,
                              read_queue_blocks=8, dram_buffer_bytes=2**32,
                              storage_read_bytes=10**12 + node))
    thresholds = Thresholds(alpha_tokens=200_000, beta_tokens=1_000_000, z_factor=1.05,
                            quota_s=0.3, read_side="dualpath",
                            source={"alpha": "config", "beta": "config", "quota": "config",
                                    "read_side": "config"})
    sched = SchedulerView(
        policy="dualpath", fifo_length=12, pe_queue_length=3, in_flight=900,
        private_queues={g: g % 3 for g in range(prefill_nodes, prefill_nodes + decode_nodes)},
        thresholds=thresholds,
        decisions=DecisionCounts(total=10**6, pe_class={"C1": 6 * 10**5, "C2": 3 * 10**5,
                                                        "C3": 10**5},
                                 de_class={"normal": 9 * 10**5, "high_token": 10**5},
                                 side={"pe": 5 * 10**5, "de": 5 * 10**5}),
        last_decision_seq=10**6, requeued_total=4)
    return ClusterView(at=at, state="ready", pd=f"{prefill_nodes}P{decode_nodes}D",
                       model="tiny", uptime_s=3600.0, engines=tuple(engines),
                       nodes=tuple(nodes), scheduler=sched)


def _engine_snapshot(e: EngineView, layers: int) -> dict[str, Any]:
    """A registry snapshot holding the families one real engine records."""
    return engine_registry(e, layers).snapshot()


def engine_registry(e: EngineView, layers: int = 4) -> MetricsRegistry:
    """A registry holding the families one real engine records."""
    r = MetricsRegistry()
    n, role = e.node, e.role
    r.counter("dualpath_storage_read_bytes_total", node=n, role=role).inc(10**9)
    r.counter("dualpath_storage_read_blocks_total", node=n, role=role).inc(10**4)
    for name in ("dualpath_storage_read_queue_length", "dualpath_storage_read_queue_tokens",
                 "dualpath_storage_read_queue_bytes", "dualpath_storage_reads_in_flight",
                 "dualpath_storage_cache_bytes", "dualpath_prefetch_accuracy_ratio",
                 "dualpath_storage_actual_bandwidth_bytes_per_second",
                 "dualpath_snic_utilization_ratio",
                 "dualpath_storage_shaped_bandwidth_bytes_per_second"):
        r.gauge(name, node=n).set(0.5)
    for tier in ("dram", "store"):
        r.histogram("dualpath_storage_read_latency_seconds", node=n, tier=tier).observe_many(
            [1e-4, 3e-3, 0.2])
        r.counter("dualpath_storage_cache_hits_total", node=n, tier=tier).inc(90)
        r.counter("dualpath_storage_cache_misses_total", node=n, tier=tier).inc(10)
        r.gauge("dualpath_storage_cache_hit_ratio", node=n, tier=tier).set(0.9)
    r.counter("dualpath_storage_cancelled_reads_total", node=n).inc(0)
    r.counter("dualpath_storage_prefetched_blocks_total", node=n).inc(5)
    r.gauge("dualpath_storage_store_bytes", root="/srv/kv").set(2**40)
    r.counter("dualpath_storage_evicted_blocks_total", root="/srv/kv").inc(3)
    eid = e.engine_id
    r.gauge("dualpath_gpu_utilization_ratio", engine=eid, node=n, role=role).set(0.5)
    r.gauge("dualpath_flops_achieved_flops_per_second", engine=eid, role=role).set(3e14)
    r.gauge("dualpath_hbm_usage_bytes", engine=eid).set(2**30)
    r.gauge("dualpath_hbm_fragmentation_ratio", engine=eid).set(0.1)
    for layer in range(layers):
        r.counter("dualpath_attention_bubble_seconds_total", role=role, layer=layer).inc(0.01)
        for tier in ("dram", "store", "peer"):
            r.counter("dualpath_layer_cache_hits_total", role=role, layer=layer,
                      tier=tier).inc(7)
    for nic, d in (("snic", "read"), ("snic", "write"), ("cnic", "tx"), ("cnic", "rx")):
        r.counter("dualpath_nic_bytes_total", node=n, nic=nic, role=role, direction=d).inc(99)
    return r


def synthetic_engine_metrics(view: ClusterView, layers: int = 4) -> dict[int, dict[str, Any]]:
    """``RuntimeSystem.metrics()``-shaped snapshots for every engine of ``view``."""
    return {e.engine_id: {"role": e.role, "node": e.node, "alive": True, "age_s": 0.1,
                          "metrics": _engine_snapshot(e, layers)} for e in view.engines}


def _median_ms(fn: Callable[[], object], repeat: int, cpu: dict[str, float] | None = None,
               label: str = "") -> tuple[float, int]:
    """Median wall ms of ``fn`` after one warm-up call (its CPU median into ``cpu[label]``)."""
    fn()  # warm up (imports, first-use caches)
    times, cpu_times = [], []
    size = 0
    for _ in range(repeat):
        c0, t0 = time.thread_time(), time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1e3)
        cpu_times.append((time.thread_time() - c0) * 1e3)
        size = len(out) if isinstance(out, (str, bytes)) else 0
    if cpu is not None:
        cpu[label] = statistics.median(cpu_times)
    return statistics.median(times), size


def measure_renders(view: ClusterView | None = None, repeat: int = 20) -> dict[str, Any]:
    """Median milliseconds to render ``/metrics`` and ``/api/v1/metrics`` for ``view``.

    Default view: :func:`synthetic_view` (1,152 engines). ``metrics_render_ms_<N>`` is the
    whole page as the live API renders it: the view, every engine's registry as the frame
    its heartbeat carries (through msgpack, as the scheduler receives it; merged with the
    layouts remembered from the previous scrape, the steady state of a live cluster: each
    scrape has new values, the same series), the scheduler's registry, host facts and a GPU
    report. ``metrics_render_cold_ms_<N>`` is the first scrape (every layout new);
    ``metrics_render_rows_ms_<N>`` the same page merged from snapshot rows (the form before
    frames, and what a recording or a test passes); ``metrics_view_render_ms_<N>`` the
    view's families alone. Every timing is wall time, median of ``repeat``; ``cpu_ms``
    has the render's own CPU time beside each (it moves less when the machine is shared).
    Keys: ``engines``, those four, ``api_metrics_render_ms_<N>``, ``metrics_bytes``,
    ``api_metrics_bytes``, ``registry_rows`` (engine registry samples merged per scrape),
    ``cpu_ms``, ``repeat``.
    """
    import msgpack

    from dualpath_cli.api.encode import view_json  # the API's own encoder
    from dualpath_cli.telemetry.frames import FrameMerger, frame

    view = view if view is not None else synthetic_view()
    n = len(view.engines)
    registries = {e.engine_id: engine_registry(e) for e in view.engines}
    snapshots = {eid: reg.snapshot() for eid, reg in registries.items()}
    engine_metrics: dict[int, dict[str, Any]] = {
        e.engine_id: {"role": e.role, "node": e.node, "alive": True, "age_s": 0.1,
                      "metrics": snapshots[e.engine_id]} for e in view.engines}
    gpu = FakeGpuBackend((GpuDevice(0, "H200", "GPU-0", 0.5, 2**30, 2**37),)).report()

    sched = MetricsRegistry()
    for name in ("dualpath_ttft_seconds", "dualpath_tpot_seconds"):
        sched.histogram(name).observe_many([0.004, 0.03, 0.2])
    for cls in ("C1", "C2", "C3"):
        sched.counter("dualpath_scheduler_decisions_total", pe_class=cls, de_class="normal",
                      side="pe").inc(1000)
    sched_snapshot = sched.snapshot()
    rows = sum(len(r) for snap in snapshots.values() for r in snap.values())

    def heartbeats() -> dict[int, dict[str, Any]]:
        """Every engine's frame as the scheduler decodes it, after one more read each."""
        out = {}
        for eid, reg in registries.items():
            reg.counter("dualpath_storage_read_blocks_total", node=view.engines[eid].node,
                        role=view.engines[eid].role).inc(1)
            out[eid] = msgpack.unpackb(msgpack.packb(frame(reg)))
        return out

    batches = [heartbeats() for _ in range(repeat + 1)]
    merger = FrameMerger()
    cpu: dict[str, float] = {}

    def scrape_frames(frames: dict[int, dict[str, Any]], m: FrameMerger) -> str:
        return render_prometheus(view, engine_frames=frames, scheduler_metrics=sched_snapshot,
                                 host=host_facts(), gpu=gpu, merger=m)

    t0 = time.perf_counter()
    scrape_frames(batches[0], merger)  # the first scrape: every layout new
    cold_ms = (time.perf_counter() - t0) * 1e3
    it = iter(batches[1:])
    text_ms, text_size = _median_ms(lambda: scrape_frames(next(it), merger), repeat - 1,
                                    cpu, "metrics")
    rows_ms, _ = _median_ms(lambda: render_prometheus(
        view, engine_metrics=engine_metrics, scheduler_metrics=sched_snapshot,
        host=host_facts(), gpu=gpu), repeat, cpu, "rows")
    view_only_ms, _ = _median_ms(lambda: render_prometheus(view), repeat, cpu, "view")
    json_ms, json_size = _median_ms(lambda: view_json(view), repeat, cpu, "api_metrics")
    return {"engines": n, f"metrics_render_ms_{n}": round(text_ms, 3),
            f"metrics_render_cold_ms_{n}": round(cold_ms, 3),
            f"metrics_render_rows_ms_{n}": round(rows_ms, 3),
            f"metrics_view_render_ms_{n}": round(view_only_ms, 3),
            f"api_metrics_render_ms_{n}": round(json_ms, 3), "metrics_bytes": text_size,
            "api_metrics_bytes": json_size, "registry_rows": rows,
            "cpu_ms": {k: round(v, 3) for k, v in cpu.items()}, "repeat": repeat}
