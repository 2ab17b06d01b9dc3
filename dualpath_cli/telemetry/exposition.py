"""Prometheus text exposition (format 0.0.4) generated from the one metrics table.

Why a plain string builder: ``/metrics`` for a 48P96D x 8 cluster (1,152 engines) carries tens
of thousands of samples, with a goal of 50 ms per render (bench/metrics_render.py measures it;
docs/benchmarks.md "API" has the numbers); generic client libraries build an object per sample
first. Every family is printed in
:data:`~dualpath_cli.telemetry.metrics.METRICS` order with its ``# HELP``, ``# TYPE`` and
``# UNIT`` lines taken from the table, so names, labels and units cannot drift.

Sources, merged per family:

* the :class:`~dualpath_cli.telemetry.view.ClusterView` (engine, node and scheduler gauges:
  :data:`VIEW_FAMILIES`). A family the view fills is taken from the view alone;
* engine registry snapshots (``RuntimeSystem.metrics()``) and the scheduler registry
  snapshot for every other family. Engines on one node record node-labelled families under
  the same labels, so samples with equal labels are merged: counters and histograms add up,
  gauges add up (queue lengths, bytes) except ratios (mean) and configured bandwidths (max);
  the cache hit ratio is recomputed from the merged hits and misses;
* host facts (psutil) and GPU facts (NVML, or ``dualpath_gpu_available 0``).

A value that is not available (``None``, NaN) is left out, never printed as a number.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from dualpath_cli.telemetry.frames import FrameMerger
from dualpath_cli.telemetry.gpu import GpuReport
from dualpath_cli.telemetry.host import HostFacts
from dualpath_cli.telemetry.metrics import METRICS, MetricType
from dualpath_cli.telemetry.view import ClusterView

__all__ = ["CONTENT_TYPE", "VIEW_FAMILIES", "render_prometheus", "format_value"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LabelKey = tuple[str, ...]
#: family -> label values (table order) -> value
Scalars = dict[str, dict[LabelKey, float]]


class _Hist:
    """A merged histogram child: ``le`` texts, cumulative counts, sum and count."""

    __slots__ = ("les", "counts", "sum", "count")

    def __init__(self, les: list[str], counts: list[float]) -> None:
        self.les = les
        self.counts = counts
        self.sum = 0.0
        self.count = 0.0


_SPECS = {m.name: m for m in METRICS}
_HEADERS: dict[str, str] = {}
for _m in METRICS:
    _help = _m.help.replace("\\", "\\\\").replace("\n", "\\n")
    _head = f"# HELP {_m.name} {_help}\n# TYPE {_m.name} {_m.type.value}\n"
    if _m.unit:
        _head += f"# UNIT {_m.name} {_m.unit}\n"
    _HEADERS[_m.name] = _head
_LABEL_PREFIX: dict[str, tuple[str, ...]] = {
    m.name: tuple(f'{label}="' for label in m.labels) for m in METRICS}

#: Families the exporter derives from the ClusterView (taken from it alone when it has them).
VIEW_FAMILIES: frozenset[str] = frozenset({
    "dualpath_cluster_ready", "dualpath_cluster_uptime_seconds", "dualpath_engine_up",
    "dualpath_engine_unfinished_requests", "dualpath_engine_unfinished_tokens",
    "dualpath_engine_heartbeat_age_seconds", "dualpath_engine_service_seconds",
    "dualpath_hbm_free_bytes",
    "dualpath_hbm_usage_bytes", "dualpath_hbm_fragmentation_ratio",
    "dualpath_gpu_utilization_ratio", "dualpath_layer_cache_hits_total",
    "dualpath_nic_bytes_total", "dualpath_snic_utilization_ratio",
    "dualpath_cnic_utilization_ratio", "dualpath_storage_read_queue_length",
    "dualpath_storage_read_queue_tokens", "dualpath_storage_read_queue_bytes",
    "dualpath_storage_cache_bytes", "dualpath_storage_shaped_bandwidth_bytes_per_second",
    "dualpath_storage_read_bytes_total", "dualpath_scheduler_queued_requests",
    "dualpath_scheduler_in_flight_requests", "dualpath_scheduler_threshold_tokens",
    "dualpath_scheduler_compute_quota_seconds",
})


def format_value(value: float) -> str:
    """A sample value as Prometheus text: integers without ``.0``, ``+Inf``/``-Inf``."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


# -- the view -----------------------------------------------------------------------------
Lines = dict[str, list[str]]


def _num(value: float) -> str:
    """A view value as text (``f"{v}"`` is valid Prometheus for ints, floats and inf)."""
    return f"{value}"


def _from_view(view: ClusterView) -> Lines:
    """Sample lines of every :data:`VIEW_FAMILIES` family the view has a value for.

    One pass per family over plain attributes, straight to text: this is the hot loop of a
    1,152-engine scrape, so no intermediate (labels, value) objects are built.
    """
    out: Lines = {}
    out["dualpath_cluster_ready"] = [f"dualpath_cluster_ready {int(view.state == 'ready')}\n"]
    out["dualpath_cluster_uptime_seconds"] = [
        f"dualpath_cluster_uptime_seconds {view.uptime_s}\n"]
    engines = [(str(e.engine_id), str(e.node), _escape(e.role), e) for e in view.engines]
    out["dualpath_engine_up"] = [
        f'dualpath_engine_up{{engine="{i}",node="{n}",role="{r}"}} '
        f'{1 if e.state == "ready" else 0}\n' for i, n, r, e in engines]
    out["dualpath_engine_unfinished_requests"] = [
        f'dualpath_engine_unfinished_requests{{engine="{i}",role="{r}"}} {e.seq}\n'
        for i, n, r, e in engines]
    out["dualpath_engine_unfinished_tokens"] = [
        f'dualpath_engine_unfinished_tokens{{engine="{i}",role="{r}"}} {e.tokens}\n'
        for i, n, r, e in engines]
    for family, attr in (("dualpath_engine_heartbeat_age_seconds", "heartbeat_age_s"),
                         ("dualpath_hbm_free_bytes", "hbm_free_bytes"),
                         ("dualpath_hbm_usage_bytes", "hbm_used_bytes"),
                         ("dualpath_hbm_fragmentation_ratio", "hbm_fragmentation")):
        head = family + '{engine="'
        out[family] = [f'{head}{i}"}} {v}\n' for i, n, r, e in engines
                       if (v := getattr(e, attr)) is not None and v == v]
    out["dualpath_engine_service_seconds"] = [
        f'dualpath_engine_service_seconds{{engine="{i}",role="{r}"}} {v}\n'
        for i, n, r, e in engines if (v := e.service_time_s) is not None and v == v]
    out["dualpath_gpu_utilization_ratio"] = [
        f'dualpath_gpu_utilization_ratio{{engine="{i}",node="{n}",role="{r}"}} {v}\n'
        for i, n, r, e in engines if (v := e.gpu_utilization) is not None and v == v]
    # per role, not per engine: engines x layers x tiers would be 14K series at 48P96D with
    # 4 layers (210K with 61); the view's JSON keeps every engine's layers
    by_role: dict[tuple[str, int], list[int]] = {}
    for _i, _n, r, e in engines:
        for lh in e.layers:
            acc = by_role.get((r, lh.layer))
            if acc is None:
                by_role[(r, lh.layer)] = [lh.dram, lh.store, lh.peer]
            else:
                acc[0] += lh.dram
                acc[1] += lh.store
                acc[2] += lh.peer
    head = 'dualpath_layer_cache_hits_total{role="'
    out["dualpath_layer_cache_hits_total"] = [
        f'{head}{r}",layer="{layer}",tier="dram"}} {d}\n'
        f'{head}{r}",layer="{layer}",tier="store"}} {s}\n'
        f'{head}{r}",layer="{layer}",tier="peer"}} {p}\n'
        for (r, layer), (d, s, p) in sorted(by_role.items())]
    nic: dict[tuple[str, str, str], int] = {}
    for _i, n, r, e in engines:
        for key, nbytes in e.nic_bytes.items():
            k = (n, r, key)
            nic[k] = nic.get(k, 0) + nbytes
    lines = []
    for (n, r, key), nbytes in nic.items():
        nic_name, _, direction = key.partition("_")
        lines.append(f'dualpath_nic_bytes_total{{node="{n}",nic="{_escape(nic_name)}",'
                     f'role="{r}",direction="{_escape(direction)}"}} {nbytes}\n')
    out["dualpath_nic_bytes_total"] = lines
    for family, attr in _NODE_FIELDS:
        head = family + '{node="'
        out[family] = [f'{head}{n.node}"}} {v}\n' for n in view.nodes
                       if (v := getattr(n, attr)) is not None and v == v]
    out["dualpath_storage_read_bytes_total"] = [
        f'dualpath_storage_read_bytes_total{{node="{n.node}",role="{_escape(n.role)}"}} '
        f'{n.storage_read_bytes}\n' for n in view.nodes if n.storage_read_bytes is not None]
    s = view.scheduler
    out["dualpath_scheduler_queued_requests"] = [
        f'dualpath_scheduler_queued_requests{{queue="fifo"}} {s.fifo_length}\n',
        f'dualpath_scheduler_queued_requests{{queue="private"}} '
        f'{sum(s.private_queues.values())}\n',
        f'dualpath_scheduler_queued_requests{{queue="pe"}} {s.pe_queue_length}\n']
    out["dualpath_scheduler_in_flight_requests"] = [
        f"dualpath_scheduler_in_flight_requests {s.in_flight}\n"]
    th = s.thresholds
    src = {k: _escape(v) for k, v in th.source.items()}
    out["dualpath_scheduler_threshold_tokens"] = [
        f'dualpath_scheduler_threshold_tokens{{threshold="alpha",source="'
        f'{src.get("alpha", "config")}"}} {th.alpha_tokens}\n',
        f'dualpath_scheduler_threshold_tokens{{threshold="beta",source="'
        f'{src.get("beta", "config")}"}} {th.beta_tokens}\n']
    out["dualpath_scheduler_compute_quota_seconds"] = [
        f'dualpath_scheduler_compute_quota_seconds{{source="{src.get("quota", "config")}"}} '
        f'{th.quota_s}\n']
    return {name: lines for name, lines in out.items() if lines}


_NODE_FIELDS = (
    ("dualpath_snic_utilization_ratio", "snic_utilization"),
    ("dualpath_cnic_utilization_ratio", "cnic_utilization"),
    ("dualpath_storage_read_queue_length", "read_queue_blocks"),
    ("dualpath_storage_read_queue_tokens", "read_queue_tokens"),
    ("dualpath_storage_read_queue_bytes", "read_queue_bytes"),
    ("dualpath_storage_cache_bytes", "dram_buffer_bytes"),
    ("dualpath_storage_shaped_bandwidth_bytes_per_second", "snic_bandwidth_bytes_per_s"),
)


# -- registry snapshots ---------------------------------------------------------------------
class _Merged:
    """Registry samples merged across snapshots (see the module doc for the rules)."""

    __slots__ = ("scalars", "means", "hists")

    def __init__(self) -> None:
        self.scalars: Scalars = {}
        self.means: dict[str, dict[LabelKey, list[float]]] = {}
        self.hists: dict[str, dict[LabelKey, _Hist]] = {}


_LABELS = operator.itemgetter("labels")
_VALUE = operator.itemgetter("value")
_BUCKETS = operator.itemgetter("buckets")
_SUM = operator.itemgetter("sum")
_COUNT = operator.itemgetter("count")


def _keys(rows: list[dict[str, Any]], names: tuple[str, ...]) -> list[LabelKey]:
    """Label values of every row in table order.

    Built with ``map`` over C-level getters (``itemgetter`` of the table's label names makes
    the tuple directly): at 1,152 engines this runs over ~25K rows. A row lacking a label of
    the table gets ``""`` for it (the slow path).
    """
    if not names:
        return [()] * len(rows)
    labels = list(map(_LABELS, rows))
    try:
        if len(names) == 1:
            return [(v,) for v in map(operator.itemgetter(names[0]), labels)]
        return list(map(operator.itemgetter(*names), labels))
    except KeyError:
        return [tuple(str(lab.get(n, "")) for n in names) for lab in labels]


def _clean(keys: list[LabelKey], values: list[Any]) -> tuple[list[LabelKey], list[Any]]:
    """Drop the samples whose value is not available (None or NaN)."""
    if None not in values and not any(map(math.isnan, values)):
        return keys, values
    pairs = [(k, v) for k, v in zip(keys, values, strict=True) if v is not None and v == v]
    return [k for k, _ in pairs], [v for _, v in pairs]


def _merge_family(name: str, rows: list[dict[str, Any]], m: _Merged) -> None:
    """Merge every snapshot's rows of one family into ``m`` (the hot loop of a big scrape).

    One call per family over all engines' rows, not one per (engine, family): the per-call
    overhead, not the per-row work, dominated a 1,152-engine scrape.
    """
    metric = _SPECS[name]
    keys = _keys(rows, metric.labels)
    if metric.type is MetricType.HISTOGRAM:
        groups: dict[LabelKey, list[int]] = {}
        for i, key in enumerate(keys):
            got = groups.get(key)
            if got is None:
                groups[key] = [i]
            else:
                got.append(i)
        fam_h = m.hists.setdefault(name, {})
        for key, idx in groups.items():
            grp = [rows[i] for i in idx]
            les = list(grp[0]["buckets"])
            # bucket bounds changed between versions: keep the first layout only
            same = [r for r in grp if len(r["buckets"]) == len(les)]
            columns = zip(*map(dict.values, map(_BUCKETS, same)), strict=True)
            h = fam_h[key] = _Hist(les, list(map(sum, columns)))
            h.sum = sum(map(_SUM, same))
            h.count = sum(map(_COUNT, same))
        return
    keys, values = _clean(keys, list(map(_VALUE, rows)))
    if metric.unit == "ratio":  # ratio gauges: the mean over engines
        fam_m = m.means.setdefault(name, {})
        for key, value in zip(keys, values, strict=True):
            acc = fam_m.get(key)
            if acc is None:
                fam_m[key] = [value, 1.0]
            else:
                acc[0] += value
                acc[1] += 1
        return
    fam = m.scalars.get(name)
    # one sample per key (an engine-labelled family, each engine reported once): no merging
    if fam is None and ("engine" in metric.labels or len(set(keys)) == len(keys)):
        m.scalars[name] = dict(zip(keys, values, strict=True))
        return
    fam = m.scalars.setdefault(name, {})
    get = fam.get
    if name.endswith("shaped_bandwidth_bytes_per_second"):  # one NIC seen by every engine
        for key, value in zip(keys, values, strict=True):
            old = get(key)
            fam[key] = value if old is None else max(old, value)
    else:
        sums: defaultdict[LabelKey, float] = defaultdict(int, fam)
        for key, value in zip(keys, values, strict=True):
            sums[key] += value
        m.scalars[name] = dict(sums)


def _merge_snapshots(snaps: list[Mapping[str, Any]], skip: frozenset[str], m: _Merged) -> None:
    """Merge registry snapshots family by family (names outside the table are dropped).

    Rows are first gathered by family in one pass over the snapshots (a lookup of every
    table family in every snapshot cost three times as much), then merged one family at a
    time.
    """
    by_family: dict[str, list[list[dict[str, Any]]]] = {}
    for snap in snaps:  # one pass over every snapshot's families
        for name, rows in snap.items():
            got = by_family.get(name)
            if got is None:
                by_family[name] = [rows]
            else:
                got.append(rows)
    if "dualpath_storage_cache_hits_total" in by_family:
        skip = skip | {"dualpath_storage_cache_hit_ratio"}  # recomputed from the counts
    for metric in METRICS:
        name = metric.name
        parts = by_family.get(name)
        if parts is None or name in skip:
            continue
        rows = list(itertools.chain.from_iterable(parts))
        if rows:
            _merge_family(name, rows, m)


def _engine_snapshots(engine_metrics: Mapping[Any, Any]) -> Iterable[Mapping[str, Any]]:
    """Registry snapshots out of ``RuntimeSystem.metrics()`` (or plain snapshots)."""
    for entry in engine_metrics.values():
        if not entry:
            continue
        snap = entry.get("metrics", entry) if isinstance(entry, Mapping) else None
        if snap:
            yield snap


def _recompute_hit_ratio(m: _Merged) -> None:
    """Cache hit ratio from the merged hits and misses (a mean of ratios would be wrong)."""
    hits = m.scalars.get("dualpath_storage_cache_hits_total")
    if not hits:
        return
    misses = m.scalars.get("dualpath_storage_cache_misses_total", {})
    ratio: dict[LabelKey, float] = {}
    for key, h in hits.items():
        lookups = h + misses.get(key, 0)
        if lookups > 0:
            ratio[key] = h / lookups
    if ratio:
        m.scalars["dualpath_storage_cache_hit_ratio"] = ratio
        m.means.pop("dualpath_storage_cache_hit_ratio", None)


# -- host and GPU ----------------------------------------------------------------------------
def _from_host(host: HostFacts, out: Scalars) -> None:
    out["dualpath_host_cpus"] = {(): host.cpu_count}
    if host.cpu_utilization is not None:
        out["dualpath_host_cpu_utilization_ratio"] = {(): host.cpu_utilization}
    out["dualpath_host_memory_total_bytes"] = {(): host.memory_total_bytes}
    out["dualpath_host_memory_used_bytes"] = {(): host.memory_used_bytes}
    out["dualpath_host_memory_available_bytes"] = {(): host.memory_available_bytes}
    nbytes: dict[LabelKey, float] = {}
    errors: dict[LabelKey, float] = {}
    drops: dict[LabelKey, float] = {}
    for n in host.nics:
        nbytes[(n.device, "tx")], nbytes[(n.device, "rx")] = n.bytes_sent, n.bytes_recv
        errors[(n.device, "tx")], errors[(n.device, "rx")] = n.errout, n.errin
        drops[(n.device, "tx")], drops[(n.device, "rx")] = n.dropout, n.dropin
    if host.nics:
        out["dualpath_host_nic_bytes_total"] = nbytes
        out["dualpath_host_nic_errors_total"] = errors
        out["dualpath_host_nic_drops_total"] = drops


def _from_gpu(gpu: GpuReport, out: Scalars) -> None:
    out["dualpath_gpu_available"] = {(): 1 if gpu.available else 0}
    if not gpu.available:
        return
    util: dict[LabelKey, float] = {}
    used: dict[LabelKey, float] = {}
    total: dict[LabelKey, float] = {}
    for d in gpu.devices:
        idx = str(d.index)
        if d.utilization is not None:
            util[(idx, d.name)] = d.utilization
        if d.memory_used_bytes is not None:
            used[(idx,)] = d.memory_used_bytes
        if d.memory_total_bytes is not None:
            total[(idx,)] = d.memory_total_bytes
    for name, fam in (("dualpath_gpu_device_utilization_ratio", util),
                      ("dualpath_gpu_memory_used_bytes", used),
                      ("dualpath_gpu_memory_total_bytes", total)):
        if fam:
            out[name] = fam


# -- rendering -------------------------------------------------------------------------------
#: Rendered label sets by family, kept across scrapes: a live cluster's label sets (engines,
#: nodes, layers, tiers) do not change between scrapes, so each is escaped and joined once.
_LABEL_TEXT: dict[str, dict[LabelKey, str]] = {}
_LABEL_TEXT_MAX = 1_000_000  # label sets kept before the cache starts over


def _label_texts(name: str, keys: Iterable[LabelKey]) -> list[str]:
    """``a="x",b="y"`` for each key (cached, see :data:`_LABEL_TEXT`)."""
    cache = _LABEL_TEXT.get(name)
    if cache is None or len(cache) > _LABEL_TEXT_MAX:
        cache = _LABEL_TEXT[name] = {}
    prefixes = _LABEL_PREFIX[name]
    out = []
    for key in keys:
        text = cache.get(key)
        if text is None:
            text = cache[key] = ",".join(
                [p + _escape(v) + '"' for p, v in zip(prefixes, key, strict=True)])
        out.append(text)
    return out


def _scalar_lines(name: str, fam: Mapping[LabelKey, float]) -> list[str]:
    if not _LABEL_PREFIX[name]:
        return [f"{name} {format_value(v)}\n" for v in fam.values()]
    return [f"{name}{{{text}}} {v}\n"
            for text, v in zip(_label_texts(name, fam), fam.values(), strict=True)]


def _hist_lines(name: str, fam: Mapping[LabelKey, _Hist]) -> list[str]:
    lines = []
    for inner, h in zip(_label_texts(name, fam), fam.values(), strict=True):
        head = f"{name}_bucket{{{inner}{',' if inner else ''}le=\""
        lines.extend([f'{head}{le}"}} {c}\n' for le, c in zip(h.les, h.counts,
                                                                  strict=True)])
        braces = f"{{{inner}}}" if inner else ""
        lines.append(f"{name}_sum{braces} {h.sum}\n{name}_count{braces} {h.count}\n")
    return lines


#: The merger of the live API's scrapes (it remembers each engine's layout between scrapes).
_FRAMES = FrameMerger()


def _from_frames(frames: Mapping[Any, Any], skip: frozenset[str], m: _Merged,
                 merger: FrameMerger) -> None:
    """Merge engine frames (telemetry/frames.py) into ``m``."""
    merged = merger.merge(frames, skip)
    if "dualpath_storage_cache_hits_total" in merged.scalars:
        merged.scalars.pop("dualpath_storage_cache_hit_ratio", None)  # recomputed
    for name, fam in merged.scalars.items():
        have = m.scalars.get(name)
        if have is None:
            m.scalars[name] = fam
        else:  # a family the scheduler's registry records too: samples add up
            for key, value in fam.items():
                have[key] = have.get(key, 0) + value
    for name, hists in merged.hists.items():
        out = m.hists.setdefault(name, {})
        for key, (les, float_counts, total, count) in hists.items():
            counts: list[float] = [int(c) for c in float_counts]  # exact: observations
            h = out.get(key)
            if h is None or len(h.counts) != len(counts):
                h = out[key] = _Hist(les, counts)
                h.sum, h.count = total, int(count)
            else:
                h.counts = [a + b for a, b in zip(h.counts, counts, strict=True)]
                h.sum += total
                h.count += int(count)


def render_prometheus(view: ClusterView | None = None, *,
                      engine_metrics: Mapping[Any, Any] | None = None,
                      engine_frames: Mapping[Any, Any] | None = None,
                      scheduler_metrics: Mapping[str, Any] | None = None,
                      host: HostFacts | None = None, gpu: GpuReport | None = None,
                      merger: FrameMerger | None = None) -> str:
    """The whole ``/metrics`` page.

    Args:
        view: the cluster snapshot (its families: :data:`VIEW_FAMILIES`).
        engine_metrics: ``RuntimeSystem.metrics()`` (engine id -> ``{"metrics": snapshot}``)
            or engine id -> ``MetricsRegistry.snapshot()``.
        engine_frames: engine id -> frame (``RuntimeSystem.metric_frames()``), the live
            API's faster form of the same (telemetry/frames.py), merged by ``merger``
            (default: one kept by this module across scrapes).
        scheduler_metrics: the scheduler registry's ``snapshot()``.
        host: host facts; gpu: GPU facts (``dualpath_gpu_available`` is printed whenever a
            report is given).
    """
    lines: Lines = _from_view(view) if view is not None else {}
    claimed = frozenset(lines)
    merged = _Merged()
    snaps = list(_engine_snapshots(engine_metrics)) if engine_metrics else []
    if scheduler_metrics:
        snaps.append(scheduler_metrics)
    _merge_snapshots(snaps, claimed, merged)
    if engine_frames:
        _from_frames(engine_frames, claimed, merged, merger or _FRAMES)
    for name, fam_m in merged.means.items():
        merged.scalars[name] = {k: acc[0] / acc[1] for k, acc in fam_m.items()}
    if "dualpath_storage_cache_hit_ratio" not in claimed:
        _recompute_hit_ratio(merged)
    if host is not None:
        _from_host(host, merged.scalars)
    if gpu is not None:
        _from_gpu(gpu, merged.scalars)
    for name, fam in merged.scalars.items():
        if fam and name not in lines:
            lines[name] = _scalar_lines(name, fam)
    for name, fam_h in merged.hists.items():
        if fam_h and name not in lines:
            lines[name] = _hist_lines(name, fam_h)
    parts: list[str] = []
    for metric in METRICS:
        fam_lines = lines.get(metric.name)
        if fam_lines:
            parts.append(_HEADERS[metric.name])
            parts.append("".join(fam_lines))
    return "".join(parts)
