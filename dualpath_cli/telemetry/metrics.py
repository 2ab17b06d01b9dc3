"""THE metrics table: every metric the project records, defined once.

The Prometheus text served at ``/metrics`` (telemetry/exposition.py), ``dualpath-monitor
--metric`` (cli/monitor_cmd.py) and docs/metrics.md are generated from or checked against
:data:`METRICS`, so names cannot drift (a full-screen TUI is planned, not built).
Conventions (Prometheus): ``dualpath_`` prefix, base units (bytes, seconds, ratio 0..1),
counters end in ``_total``, identities (engine, node, role, layer, tier, nic, ...) are labels,
never part of the name. Add a metric here before recording it; the registry refuses others.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

__all__ = ["MetricType", "MetricSpec", "METRICS", "spec", "UNITS", "LATENCY_BUCKETS",
           "TURN_LATENCY_BUCKETS", "DECISION_BUCKETS"]


class MetricType(str, Enum):
    """Prometheus metric kinds."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


# Base units only. "" is a plain count (blocks, requests).
UNITS: tuple[str, ...] = ("", "bytes", "seconds", "ratio", "tokens", "bytes_per_second",
                          "flops_per_second", "flops")

# Read latency buckets: 10 us (DRAM hit) .. 10 s (a queued read behind a saturated SNIC).
LATENCY_BUCKETS: tuple[float, ...] = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)

# Turn latency buckets (TTFT, TPOT): 1 ms (a cached turn on the tiny model) .. 60 s.
TURN_LATENCY_BUCKETS: tuple[float, ...] = (
    1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
    60.0,
)

# Scheduling-call buckets: 1 us (an empty-ish fetch) .. 1 s (a scheduler far behind).
DECISION_BUCKETS: tuple[float, ...] = (
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
    2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0,
)

_NAME = re.compile(r"^dualpath_[a-z][a-z0-9_]*$")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One row of the table.

    Args:
        name: full Prometheus name (``dualpath_`` prefix; ``_total`` iff a counter).
        type: counter, gauge or histogram.
        unit: a base unit from :data:`UNITS` ("" for plain counts).
        labels: label names, in the order exporters print them.
        help: one sentence saying what is measured.
        buckets: histogram bucket upper bounds (histograms only).
    """

    name: str
    type: MetricType
    unit: str
    labels: tuple[str, ...]
    help: str
    buckets: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"metric {self.name!r}: names are dualpath_[a-z0-9_]+")
        if (self.type is MetricType.COUNTER) != self.name.endswith("_total"):
            raise ValueError(f"metric {self.name!r}: counters, and only counters, end in _total")
        if self.unit not in UNITS:
            raise ValueError(f"metric {self.name!r}: unit {self.unit!r} is not a base unit")
        if self.unit and self.unit not in self.name:
            raise ValueError(f"metric {self.name!r}: the name must carry its unit {self.unit!r}")
        if (self.type is MetricType.HISTOGRAM) != bool(self.buckets):
            raise ValueError(f"metric {self.name!r}: buckets are required for, and only for, "
                             "histograms")


_C, _G, _H = MetricType.COUNTER, MetricType.GAUGE, MetricType.HISTOGRAM

METRICS: tuple[MetricSpec, ...] = (
    # --- storage: loader and stores (issue 3) ------------------------------------------------
    MetricSpec("dualpath_storage_read_bytes_total", _C, "bytes", ("node", "role"),
               "Bytes of Full Blocks read from the store by a node's loader."),
    MetricSpec("dualpath_storage_read_blocks_total", _C, "", ("node", "role"),
               "Full Blocks read from the store by a node's loader."),
    MetricSpec("dualpath_storage_read_queue_length", _G, "", ("node",),
               "Full Blocks queued or in flight in a node's loader (the seed's "
               "read_queue_length)."),
    MetricSpec("dualpath_storage_read_queue_tokens", _G, "tokens", ("node",),
               "Tokens queued or in flight in a node's loader: the read_q compared with alpha."),
    MetricSpec("dualpath_storage_read_queue_bytes", _G, "bytes", ("node",),
               "Bytes queued or in flight in a node's loader."),
    MetricSpec("dualpath_storage_reads_in_flight", _G, "", ("node",),
               "Store reads issued and not yet completed."),
    MetricSpec("dualpath_storage_read_latency_seconds", _H, "seconds", ("node", "tier"),
               "Time from submission to completion of one block read, by serving tier.",
               LATENCY_BUCKETS),
    MetricSpec("dualpath_storage_read_service_seconds", _H, "seconds", ("node",),
               "Time the store spent on one read batch: from when a reader started its I/O "
               "(or, when the reader was still busy with the batch before, from when it "
               "was free) to when the store returned it, queue wait and NIC pacing excluded; "
               "a node's probe reads (dualpath_storage_probe_reads_total) included.",
               LATENCY_BUCKETS),
    MetricSpec("dualpath_storage_probe_reads_total", _C, "", ("node",),
               "Probe reads of a node's store: one block it read before, read again every 2 s "
               "in which the node served no store read, so that a store the scheduler steers "
               "reads away from still shows its service time (not a turn's read: not in the "
               "read counters)."),
    MetricSpec("dualpath_storage_cache_hits_total", _C, "", ("node", "tier"),
               "Block lookups served by a tier (dram = loader buffer cache, store)."),
    MetricSpec("dualpath_storage_cache_misses_total", _C, "", ("node", "tier"),
               "Block lookups a tier could not serve."),
    MetricSpec("dualpath_storage_cache_hit_ratio", _G, "ratio", ("node", "tier"),
               "Hits over lookups since start, by tier (the seed's cache_hit_ratio)."),
    MetricSpec("dualpath_storage_cache_bytes", _G, "bytes", ("node",),
               "Bytes held by a node's DRAM buffer cache."),
    MetricSpec("dualpath_storage_read_errors_total", _C, "", ("node", "reason"),
               "Block reads from the store by a node's loader that failed (read_failed: an "
               "I/O error such as EIO; timed_out): each is a miss, re-read or recomputed."),
    MetricSpec("dualpath_storage_corrupt_blocks_total", _C, "", ("node", "reason"),
               "Blocks found corrupt (checksum, truncated, foreign header) and quarantined."),
    MetricSpec("dualpath_storage_cancelled_reads_total", _C, "", ("node",),
               "Queued block reads dropped because their request was cancelled."),
    MetricSpec("dualpath_storage_prefetched_blocks_total", _C, "", ("node",),
               "Blocks read ahead into the DRAM buffer cache by prefetch."),
    MetricSpec("dualpath_storage_warm_bytes_total", _C, "bytes", ("node",),
               "Block bytes a warm-up (storage warm) read into the DRAM buffer cache."),
    MetricSpec("dualpath_storage_warm_blocks_remaining", _G, "", ("node",),
               "Blocks a warm-up in progress has still to read (0 when done or none)."),
    MetricSpec("dualpath_storage_shaped_bandwidth_bytes_per_second", _G, "bytes_per_second",
               ("node",), "Configured storage-NIC bandwidth of the shaper (0 = unshaped)."),
    MetricSpec("dualpath_storage_actual_bandwidth_bytes_per_second", _G, "bytes_per_second",
               ("node",), "Measured read bandwidth over the last completed batch window."),
    MetricSpec("dualpath_snic_utilization_ratio", _G, "ratio", ("node",),
               "Storage-NIC utilisation: actual over shaped bandwidth (the seed's "
               "snic_utilization)."),
    MetricSpec("dualpath_storage_store_bytes", _G, "bytes", ("root",),
               "Bytes of block files held by a store (its root path, or memory:N), as this "
               "process tracks them."),
    MetricSpec("dualpath_storage_evicted_blocks_total", _C, "", ("root",),
               "Blocks evicted by a store's capacity limit or by gc."),
    MetricSpec("dualpath_storage_replicated_blocks_total", _C, "", ("root",),
               "Hot blocks copied to an extra store root."),
    MetricSpec("dualpath_storage_write_errors_total", _C, "", ("node", "role", "reason"),
               "Full Blocks a node's engines could not persist, by why the store refused the "
               "write (full: ENOSPC or over capacity, read_only: EROFS, failed: EIO or any "
               "other error); the block is recomputed when next needed."),
    MetricSpec("dualpath_storage_block_reads_total", _C, "", ("node", "block"),
               "Reads of one block from the store by a node's engines since start, for each "
               "engine's 8 most-read blocks only (hot-spot evidence with bounded labels)."),
    MetricSpec("dualpath_storage_block_copy_reads_total", _C, "", ("node", "block", "root"),
               "Reads of a replicated block served by each store root holding a copy (of "
               "those 8 blocks, where replica roots are configured): how a hot block's reads "
               "spread over its copies."),
    # --- compute (seed) ----------------------------------------------------------------------
    MetricSpec("dualpath_gpu_utilization_ratio", _G, "ratio", ("engine", "node", "role"),
               "GPU busy fraction of an engine."),
    MetricSpec("dualpath_attention_bubble_seconds_total", _C, "seconds", ("role", "layer"),
               "Time a layer's attention waited for its KV (layerwise-prefill bubbles), "
               "summed over the role's engines (per engine: the view's layer slack)."),
    MetricSpec("dualpath_flops_achieved_flops_per_second", _G, "flops_per_second",
               ("engine", "role"), "Achieved model FLOP/s of an engine."),
    # --- memory (seed) -----------------------------------------------------------------------
    MetricSpec("dualpath_hbm_usage_bytes", _G, "bytes", ("engine",),
               "HBM held by an engine's KV pool."),
    MetricSpec("dualpath_hbm_fragmentation_ratio", _G, "ratio", ("engine",),
               "HBM fragmentation score 0..1 (1 - largest free run / free)."),
    MetricSpec("dualpath_prefetch_accuracy_ratio", _G, "ratio", ("node",),
               "Prefetched blocks a later request used (a DRAM-cache hit, or joining the "
               "read in flight), over blocks prefetched by a node's loader."),
    # --- per-layer hits and per-NIC traffic (seed) -------------------------------------------
    MetricSpec("dualpath_layer_cache_hits_total", _C, "", ("role", "layer", "tier"),
               "Layer Blocks served per layer, by tier (dram, store, peer), summed over the "
               "role's engines (per engine: the view's layer hits)."),
    MetricSpec("dualpath_nic_bytes_total", _C, "bytes", ("node", "nic", "role", "direction"),
               "Bytes moved through a NIC (snic, cnic), by engine role and direction."),
    # --- live cluster exporter (issue 12, api/): view-derived, host and GPU facts -------------
    # Gauges derived from the ClusterView at scrape time (telemetry/exposition.py).
    MetricSpec("dualpath_cluster_ready", _G, "", (),
               "Whether every engine has said hello and the cluster admits turns (1) or not "
               "(0)."),
    MetricSpec("dualpath_cluster_uptime_seconds", _G, "seconds", (),
               "Seconds since the live cluster started."),
    MetricSpec("dualpath_engine_up", _G, "", ("engine", "node", "role"),
               "Whether an engine is ready (1) or starting, draining or dead (0)."),
    MetricSpec("dualpath_engine_unfinished_requests", _G, "", ("engine", "role"),
               "Requests assigned to an engine and not finished (the scheduler's seq)."),
    MetricSpec("dualpath_engine_unfinished_tokens", _G, "tokens", ("engine", "role"),
               "Tokens of the requests assigned to an engine and not finished (tok)."),
    MetricSpec("dualpath_engine_service_seconds", _G, "seconds", ("engine", "role"),
               "An engine's compute per batched request (a decode step or a prefill batch "
               "item: busy seconds over requests batched) over its last window of about a "
               "second; absent while it ran nothing. A slow engine's is high."),
    MetricSpec("dualpath_engine_heartbeat_age_seconds", _G, "seconds", ("engine",),
               "Seconds since the scheduler last heard from an engine."),
    MetricSpec("dualpath_hbm_free_bytes", _G, "bytes", ("engine",),
               "HBM free in an engine's KV pool."),
    MetricSpec("dualpath_cnic_utilization_ratio", _G, "ratio", ("node",),
               "Compute-NIC utilisation of a node: actual over configured bandwidth."),
    MetricSpec("dualpath_scheduler_queued_requests", _G, "", ("queue",),
               "Requests waiting in a scheduler queue (fifo: global FIFO, private: routed "
               "to a DE group, pe: placed and waiting for a PE)."),
    MetricSpec("dualpath_scheduler_in_flight_requests", _G, "", (),
               "Requests dispatched to engines and not finished."),
    MetricSpec("dualpath_scheduler_threshold_tokens", _G, "tokens", ("threshold", "source"),
               "Scheduler thresholds in force (alpha, beta) in tokens, with where each came "
               "from (config, flag, api, controller, default)."),
    MetricSpec("dualpath_scheduler_compute_quota_seconds", _G, "seconds", ("source",),
               "PE compute quota per forward batch in force, with where it came from."),
    # Host facts from psutil (telemetry/host.py), sampled at scrape time.
    MetricSpec("dualpath_host_cpus", _G, "", (), "Logical CPUs of the host."),
    MetricSpec("dualpath_host_cpu_utilization_ratio", _G, "ratio", (),
               "Host CPU busy fraction since the previous scrape."),
    MetricSpec("dualpath_host_memory_total_bytes", _G, "bytes", (), "Host physical memory."),
    MetricSpec("dualpath_host_memory_used_bytes", _G, "bytes", (),
               "Host memory in use (total minus available)."),
    MetricSpec("dualpath_host_memory_available_bytes", _G, "bytes", (),
               "Host memory available to new processes without swapping."),
    MetricSpec("dualpath_host_nic_bytes_total", _C, "bytes", ("device", "direction"),
               "Bytes through a host network interface since boot (direction tx or rx)."),
    MetricSpec("dualpath_host_nic_errors_total", _C, "", ("device", "direction"),
               "Errors on a host network interface since boot (direction tx or rx)."),
    MetricSpec("dualpath_host_nic_drops_total", _C, "", ("device", "direction"),
               "Packets dropped on a host network interface since boot (direction tx or rx)."),
    # GPU facts from NVML (telemetry/gpu.py); device gauges only when available is 1.
    MetricSpec("dualpath_gpu_available", _G, "", (),
               "Whether GPU facts are available from NVML (1) or not (0, no device samples)."),
    MetricSpec("dualpath_gpu_device_utilization_ratio", _G, "ratio", ("gpu", "model"),
               "GPU busy fraction over the driver's last sample period."),
    MetricSpec("dualpath_gpu_memory_used_bytes", _G, "bytes", ("gpu",),
               "GPU memory in use on a device."),
    MetricSpec("dualpath_gpu_memory_total_bytes", _G, "bytes", ("gpu",),
               "GPU memory of a device."),
    # --- scheduler (issue 12, runtime/): recorded by SchedulerService.registry ---------------
    MetricSpec("dualpath_ttft_seconds", _H, "seconds", (),
               "Time to first token of a finished turn: submission to the PE's first token.",
               TURN_LATENCY_BUCKETS),
    MetricSpec("dualpath_tpot_seconds", _H, "seconds", (),
               "Time per output token after the first, of a finished turn of two or more "
               "tokens.", TURN_LATENCY_BUCKETS),
    MetricSpec("dualpath_scheduler_decisions_total", _C, "", ("pe_class", "de_class", "side"),
               "Scheduling decisions, by the chosen PE's class (C1, C2, C3), the chosen DE's "
               "class (normal, high_token) and the read side (pe, de, split)."),
    MetricSpec("dualpath_scheduler_requeued_turns_total", _C, "", ("reason",),
               "Turns put back at the head of the FIFO (engine_dead, engine_left: placed "
               "on a node that began to leave, read_failed, kv_lost: a KV message lost on "
               "the compute fabric, scheduler_restart)."),
    MetricSpec("dualpath_scheduler_cancelled_turns_total", _C, "", (),
               "Turns their caller gave up before they finished (a streaming client that "
               "disconnected): dropped, their engines told to free what they held."),
    MetricSpec("dualpath_scheduler_engines", _G, "", ("role", "state"),
               "Engines by role and state (starting, ready, draining: its node is leaving "
               "and finishes its turns, dead, left: its node left on purpose)."),
    MetricSpec("dualpath_engines", _G, "", ("role", "state"),
               "Engines by role and state, from the one membership record (as "
               "dualpath_scheduler_engines; status, /readyz and diagnose read the same "
               "record): a role with no ready engine makes the cluster unready."),
    MetricSpec("dualpath_engine_restarts_total", _C, "", ("role",),
               "Engines the launcher restarted after their process died (cluster.restart: "
               "backoff 0.5 s doubling to 30 s; five deaths in 60 s is a crash loop and the "
               "engine stays down)."),
    MetricSpec("dualpath_scheduler_decision_latency_seconds", _H, "seconds", ("kind",),
               "Wall time of one scheduling call that found work, by kind (de_fetch: route "
               "the FIFO and place on a DE group's engines; pe_fetch: choose PEs and read "
               "sides and dispatch), on the scheduler thread.", DECISION_BUCKETS),
    MetricSpec("dualpath_scheduler_cpu_seconds_total", _C, "seconds", (),
               "CPU time of the scheduler's service thread (sampled about every 50 ms): "
               "over wall time, the cores the scheduler uses; it needs under one."),
    # --- KV hit rates with a denominator, and why blocks missed (issue 19) -------------------
    # Token-denominated so a hit rate is rate(hit)/rate(requested) in PromQL. Labels stay
    # per tier/side/layer/reason (no engine or node): a few dozen series at any cluster size.
    MetricSpec("dualpath_kv_requested_tokens_total", _C, "tokens", ("tier",),
               "Prompt tokens looked up in a KV tier: store (the scheduler's prefix lookup, "
               "every prompt token), dram (a loader's DRAM buffer, the cached prefix it was "
               "asked to read), hbm (prompt tokens a PE needs in HBM)."),
    MetricSpec("dualpath_kv_hit_tokens_total", _C, "tokens", ("tier",),
               "Tokens a KV tier served: store (cached prefix found), dram (served from the "
               "DRAM buffer), hbm (already in HBM: 0, the runtime keeps no KV in HBM "
               "across turns)."),
    MetricSpec("dualpath_kv_cross_conversation_hit_tokens_total", _C, "tokens", (),
               "Store hits another conversation stored (a shared system prompt): hit tokens "
               "beyond the chain the agent's own last turn stored, as a global KV store "
               "sees them."),
    MetricSpec("dualpath_kv_read_bytes_total", _C, "bytes", ("tier", "side"),
               "Cached-prefix KV bytes read, by tier and the side that read them (pe, de): "
               "store through a storage NIC, dram from a DRAM buffer, hbm written into the "
               "PE's HBM (de: streamed over the compute NIC)."),
    MetricSpec("dualpath_kv_miss_blocks_total", _C, "", ("tier", "reason"),
               "KV blocks a tier did not serve, each with one reason (never_stored, "
               "prefix_diverged, evicted, quarantined, read_failed, timed_out, cancelled)."),
    MetricSpec("dualpath_kv_evicted_block_age_seconds", _H, "seconds", ("tier",),
               "Age of a block whose eviction caused a miss: dram, since it entered the "
               "buffer until evicted; store, since the turn that wrote it ended.",
               TURN_LATENCY_BUCKETS + (120.0, 300.0, 600.0, 1800.0, 3600.0)),
    MetricSpec("dualpath_kv_layer_hit_tokens_total", _C, "tokens", ("layer", "tier"),
               "Cached-prefix tokens placed in a PE's HBM per layer, by source tier (dram, "
               "store: the PE's buffer; peer: streamed from the DE); per-layer hit rate is "
               "this over the hbm tier's requested tokens."),
)

_BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}
if len(_BY_NAME) != len(METRICS):  # pragma: no cover - guarded by tests
    raise RuntimeError("duplicate metric names in METRICS")


def spec(name: str) -> MetricSpec:
    """The table row for ``name``; ``KeyError`` naming it when it is not in the table."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not in the metrics table "
                       "(dualpath_cli/telemetry/metrics.py)") from None
