"""``dualpath-monitor`` (also ``dualpath monitor``): watch a few metrics of a live cluster.

The seed's own commands work as written::

    dualpath-monitor --metric hbm_frag --interval 1s
    dualpath-monitor --metric cache_hit --by-layer

Short names map onto the metrics table in :data:`MONITOR_METRICS` (one table: the row says
which table metric a name shows and where its value comes from, the ClusterView or
``/metrics``). In a terminal the table redraws in place with deltas and a sparkline per
row; piped, it prints one sample (``--once``), or JSON Lines with ``--json``. ``--from``
plays a recording instead of asking a cluster. Heavy modules (httpx, the client) load
inside the command so ``dualpath --help`` stays fast.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dualpath_cli.cli.lost_output import guard_stdout
from dualpath_cli.cli.options import PortOption, TokenFileOption, UrlOption, json_option
from dualpath_cli.cli.sampling import parse_interval
from dualpath_cli.errors import UsageError, pick

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from dualpath_cli.cli.source import ClusterRef
    from dualpath_cli.faultspec import Fault
    from dualpath_cli.telemetry.recording import Sample

__all__ = ["MONITOR_METRICS", "MonitorMetric", "Row", "monitor", "main", "register",
           "rows_for", "layer_rows", "render_table"]

#: Points kept per sparkline.
SPARK_POINTS = 24
_SPARK = "▁▂▃▄▅▆▇█"


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the monitor: what it is about and its value (``None``: not available)."""

    metric: str
    key: str
    role: str | None
    node: int | None
    engine: int | None
    value: float | None


@dataclass(frozen=True, slots=True)
class MonitorMetric:
    """A short name of the seed and what it shows.

    Args:
        name: the seed's short name (``hbm_frag``).
        metric: the metrics-table row it shows (telemetry/metrics.py).
        scope: ``engine`` or ``node``: what one value belongs to.
        unit: ``ratio`` (printed as %), ``blocks`` or ``seconds``.
        source: ``view`` (the ClusterView) or ``metrics`` (the ``/metrics`` extras).
        help: one line for the help text and the error listing.
    """

    name: str
    metric: str
    scope: str
    unit: str
    source: str
    help: str


#: THE mapping of the seed's short names onto the metrics table.
MONITOR_METRICS: dict[str, MonitorMetric] = {m.name: m for m in (
    MonitorMetric("hbm_frag", "dualpath_hbm_fragmentation_ratio", "engine", "ratio", "view",
                  "HBM fragmentation score per engine (1 - largest free run / free)"),
    MonitorMetric("cache_hit", "dualpath_storage_cache_hit_ratio", "node", "ratio", "metrics",
                  "cache hits over lookups per node and tier (--by-layer: per-layer tiers "
                  "and load-ahead slack from dualpath_layer_cache_hits_total)"),
    MonitorMetric("snic_util", "dualpath_snic_utilization_ratio", "node", "ratio", "view",
                  "storage-NIC utilisation per node"),
    MonitorMetric("read_queue", "dualpath_storage_read_queue_length", "node", "blocks", "view",
                  "Full Blocks queued or in flight in a node's loader"),
    MonitorMetric("gpu_util", "dualpath_gpu_utilization_ratio", "engine", "ratio", "view",
                  "GPU busy fraction per engine"),
    MonitorMetric("bubble", "dualpath_attention_bubble_seconds_total", "engine", "seconds",
                  "view", "seconds the engine's last prefill waited for KV (negative slack)"),
    MonitorMetric("prefetch_accuracy", "dualpath_prefetch_accuracy_ratio", "node", "ratio",
                  "metrics", "prefetched blocks a later request used, per node"),
    MonitorMetric("warm", "dualpath_storage_warm_blocks_remaining", "node", "blocks",
                  "metrics", "blocks a warm-up (storage warm) has still to read, per node"),
)}


def _node_label(role: str | None, node: int | None, names: dict[int, str] | None = None
                ) -> str:
    """The operator's name of a node (``--node D0``, from the view), else ``P0``/``D1``."""
    if node is None:
        return "?"
    if names and node in names:
        return names[node]
    return f"{'P' if role == 'prefill' else 'D'}{node}"


def _names(sample: Sample) -> dict[int, str]:
    """Node index -> the operator's name, as the membership record gives them."""
    return {n.node: n.name for n in sample.view.nodes if n.name}


def _bubble(layers: Any) -> float | None:
    slacks = [h.slack_s for h in layers if h.slack_s is not None]
    if not slacks:
        return None
    return sum(-s for s in slacks if s < 0)


_ENGINE_GET: dict[str, Callable[[Any], float | None]] = {
    "hbm_frag": lambda e: e.hbm_fragmentation,
    "gpu_util": lambda e: e.gpu_utilization,
    "bubble": lambda e: _bubble(e.layers),
}
_NODE_GET: dict[str, Callable[[Any], float | None]] = {
    "snic_util": lambda n: n.snic_utilization,
    "read_queue": lambda n: n.read_queue_blocks,
}


def _natural_rows(metric: MonitorMetric, sample: Sample) -> list[Row]:
    view = sample.view
    roles = {n.node: n.role for n in view.nodes}
    names = _names(sample)
    if metric.name in _ENGINE_GET:
        get = _ENGINE_GET[metric.name]
        return [Row(metric.name, f"engine {e.engine_id}", e.role, e.node, e.engine_id,
                    get(e)) for e in view.engines]
    if metric.name in _NODE_GET:
        get = _NODE_GET[metric.name]
        return [Row(metric.name, f"node {_node_label(n.role, n.node, names)}", n.role, n.node, None,
                    get(n)) for n in view.nodes]
    if metric.name == "warm":
        left = sample.extras.warm_blocks_remaining
        return [Row(metric.name, f"node {_node_label(n.role, n.node, names)}", n.role, n.node, None,
                    None if n.node not in left else float(left[n.node])) for n in view.nodes]
    if metric.name == "prefetch_accuracy":
        acc = sample.extras.prefetch_accuracy
        return [Row(metric.name, f"node {_node_label(n.role, n.node, names)}", n.role, n.node, None,
                    acc.get(n.node)) for n in view.nodes]
    if metric.name == "cache_hit":
        out = []
        for key, value in sorted(sample.extras.cache_hit_ratio.items()):
            node_s, _, tier = key.partition("/")
            node = int(node_s) if node_s.lstrip("-").isdigit() else None
            role = roles.get(node) if node is not None else None
            out.append(Row(metric.name, f"node {_node_label(role, node, names)} {tier}", role, node,
                           None, value))
        if not out:  # the family is absent: say so per node
            out = [Row(metric.name, f"node {_node_label(n.role, n.node, names)}", n.role, n.node,
                       None, None) for n in view.nodes]
        return out
    raise UsageError(f"metric {metric.name!r} has no extractor")  # pragma: no cover


def rows_for(metric: MonitorMetric, sample: Sample, by: str | None = None,
             role: str | None = None) -> list[Row]:
    """The rows of ``metric`` in ``sample``, grouped ``by`` engine or node (default: the
    metric's own scope), only engines/nodes of ``role`` when given."""
    rows = _natural_rows(metric, sample)
    names = _names(sample)
    by = by or metric.scope
    if by == "node" and metric.scope == "engine":
        groups: dict[int, list[Row]] = {}
        for r in rows:
            groups.setdefault(r.node if r.node is not None else -1, []).append(r)
        rows = []
        for node, members in sorted(groups.items()):
            vals = [r.value for r in members if r.value is not None]
            rows.append(Row(metric.name, f"node {_node_label(members[0].role, node, names)}",
                            members[0].role, node, None,
                            sum(vals) / len(vals) if vals else None))
    elif by == "engine" and metric.scope == "node":
        per_node: dict[int | None, list[Row]] = {}
        for r in rows:
            per_node.setdefault(r.node, []).append(r)
        rows = []
        for e in sample.view.engines:
            for r in per_node.get(e.node, []):
                suffix = r.key.split(" ", 2)[2] if r.key.count(" ") >= 2 else ""
                rows.append(Row(metric.name, f"engine {e.engine_id}" +
                                (f" {suffix}" if suffix else ""), e.role, e.node,
                                e.engine_id, r.value))
    if role is not None:
        rows = [r for r in rows if r.role == role]
    return rows


def layer_rows(sample: Sample, role: str | None = None) -> list[dict[str, Any]]:
    """``--by-layer``: per layer, the share of Layer Blocks each tier served (since start)
    and the median load-ahead slack across engines (negative is a bubble)."""
    import statistics

    acc: dict[int, list[Any]] = {}
    for e in sample.view.engines:
        if role is not None and e.role != role:
            continue
        for h in e.layers:
            row = acc.setdefault(h.layer, [0, 0, 0, []])
            row[0] += h.dram
            row[1] += h.store
            row[2] += h.peer
            if h.slack_s is not None:
                row[3].append(h.slack_s)
    out = []
    for layer in sorted(acc):
        dram, store, peer, slacks = acc[layer]
        total = dram + store + peer
        out.append({"layer": layer, "blocks": total,
                    "dram": dram / total if total else None,
                    "store": store / total if total else None,
                    "peer": peer / total if total else None,
                    "slack_s": statistics.median(slacks) if slacks else None,
                    "bubble": bool(slacks) and statistics.median(slacks) < 0})
    return out


# --- rendering -------------------------------------------------------------------------------
def sparkline(values: list[float | None]) -> str:
    """Unicode bars of ``values`` (blank for not available), scaled to their own range."""
    vals = [v for v in values if v is not None]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = hi - lo
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        else:
            idx = 0 if span <= 0 else int((v - lo) / span * (len(_SPARK) - 1) + 0.5)
            out.append(_SPARK[idx])
    return "".join(out)


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "ratio":
        return f"{value * 100:.1f}%"
    if unit == "seconds":
        return f"{value * 1e3:.2f} ms"
    return f"{value:g}"


def _fmt_delta(value: float | None, prev: float | None, unit: str) -> str:
    if value is None or prev is None:
        return ""
    d = value - prev
    if unit == "ratio":
        return f"{d * 100:+.1f}pp"
    if unit == "seconds":
        return f"{d * 1e3:+.2f} ms"
    return f"{d:+g}"


#: Samples the diagnose rules judge (the monitor's own recent window).
FINDING_WINDOW = 30
#: The rules judge every sample up to this many engines, every k-th beyond (k = engines /
#: this, rounded up): at 1,152 engines they cost a few hundred ms over the window.
RULES_ENGINES = 256


class History:
    """Past values per row key, for deltas and sparklines; recent samples for the rules."""

    def __init__(self) -> None:
        self._h: dict[tuple[str, str], deque[float | None]] = {}
        self._samples: deque[Sample] = deque(maxlen=FINDING_WINDOW)
        self._open: dict[str, list[tuple[bool, str]]] = {}
        self._seen = 0
        self._previous: dict[str, Any] | None = None

    def open_findings(self, sample: Sample) -> dict[str, list[tuple[bool, str]]]:
        """Subject (``node D1``, ``engine 3``) -> (critical, workflow) of each open
        findings of the diagnose rules over the recent samples (every sample, or every
        k-th on a large cluster: RULES_ENGINES; between runs the last verdicts stand)."""
        self._samples.append(sample)
        self._seen += 1
        every = -(-len(sample.view.engines) // RULES_ENGINES) or 1
        if (self._seen - 1) % every:
            return self._open
        from dualpath_cli.diagnose import rules
        from dualpath_cli.diagnose.model import Evidence, Severity
        from dualpath_cli.diagnose.verdict import previous_grades

        found: dict[str, list[tuple[bool, str]]] = {}
        # the last run's verdicts are the rules' previous ones (hysteresis: a steady fault
        # keeps its mark from tick to tick)
        reports = rules.run_all(Evidence(tuple(self._samples), previous=self._previous))
        self._previous = previous_grades([f for r in reports for f in r.findings])
        for report in reports:
            for f in report.findings:
                if f.subject and f.severity in (Severity.WARNING, Severity.CRITICAL):
                    text = (f.severity is Severity.CRITICAL, f.workflow)
                    if text not in found.setdefault(f.subject, []):
                        found[f.subject].append(text)
        self._open = found
        return found

    def push(self, rows: list[Row]) -> dict[tuple[str, str], tuple[float | None, str]]:
        """Record ``rows``; returns each row's previous value and sparkline."""
        out = {}
        for r in rows:
            q = self._h.setdefault((r.metric, r.key), deque(maxlen=SPARK_POINTS))
            prev = q[-1] if q else None
            q.append(r.value)
            out[(r.metric, r.key)] = (prev, sparkline(list(q)))
        return out


def kv_wait(sample: Sample, role: str | None = None) -> float | None:
    """Median over prefill engines of their prefills' wait for KV before compute (the
    view's windowed ``kv_wait_s``); ``None`` when no prefill of a cached prefix ran."""
    if role == "decode":
        return None
    waits = [e.kv_wait_s for e in sample.view.engines if e.kv_wait_s is not None]
    import statistics

    return statistics.median(waits) if waits else None


#: Metrics whose rows show the part's capacity beside the utilisation.
_CAPACITY = {"snic_util"}


def _capacity(sample: Sample, row: Row) -> float | None:
    """The storage-NIC rate the row's node runs at (bytes/s; a throttled NIC's lowered rate;
    ``None``: unshaped or not known)."""
    for n in sample.view.nodes:
        if n.node == row.node:
            return n.snic_bandwidth_bytes_per_s
    return None


def _covering(sample: Sample, faults: tuple[Fault, ...], row: Row) -> list[Fault]:
    """The faults in force on the row's part: its node's, and its engine's (or, for a node
    row, its engines')."""
    engines = ({row.engine} if row.engine is not None else
               {e.engine_id for e in sample.view.engines if e.node == row.node})
    return [f for f in faults
            if f.target in (("node", row.node), *(("engine", e) for e in engines))]


def _subjects(sample: Sample, row: Row) -> list[str]:
    """What findings would name the row's part: its node and its engine(s)."""
    roles = {n.node: n.role for n in sample.view.nodes}
    engines = ({row.engine} if row.engine is not None else
               {e.engine_id for e in sample.view.engines if e.node == row.node})
    out = [f"node {_node_label(roles.get(row.node), row.node)}"] if row.node is not None else []
    return out + [f"engine {e}" for e in sorted(engines)]


def _mark(found: list[Fault], findings: Sequence[tuple[bool, str]] = ()) -> tuple[str, str]:
    """The part's mark and what it stands for: ``("!", "fault #1 snic_throttle")``, or
    ``("!!", "hbm-frag")`` when an open finding is CRITICAL (a fault in force, degraded on
    purpose, and a WARNING are ``!``); ``("", "")`` when nothing covers the part."""
    words = [f"fault #{f.id} {f.kind}" for f in found]
    words += [w for i, (_, w) in enumerate(findings) if w not in [x for _, x in findings[:i]]]
    if not words:
        return "", ""
    return ("!!" if any(c for c, _ in findings) else "!"), ", ".join(words)


def render_table(sample: Sample, metrics: list[MonitorMetric], by: str | None,
                 role: str | None, history: History, by_layer: bool,
                 faults: tuple[Fault, ...] = ()) -> RenderableType:
    """The table shown for one sample (rich renderable); ``faults``: those in force, marked
    on the rows of the parts they cover."""
    from rich.markup import escape
    from rich.table import Table

    from dualpath_cli.units import format_bandwidth, format_duration

    when = time.strftime("%H:%M:%S", time.gmtime(sample.at))
    title = (f"dualpath-monitor  {sample.view.pd}  {sample.view.state}  {when} UTC  "
             f"uptime {format_duration(sample.view.uptime_s)}")
    if by_layer:
        table = Table(title=title, title_justify="left", expand=False)
        for col in ("layer", "blocks", "dram", "store", "peer", "slack", "trend"):
            table.add_column(col, justify="left" if col in ("layer", "trend") else "right")
        layers = layer_rows(sample, role)
        fake = [Row("slack", f"layer {r['layer']}", None, None, None, r["slack_s"])
                for r in layers]
        hist = history.push(fake)
        for r, f in zip(layers, fake, strict=True):
            slack = r["slack_s"]
            text = "n/a" if slack is None else f"{slack * 1e3:+.2f} ms"
            if r["bubble"]:
                text = f"[red]{text} bubble[/]"
            table.add_row(str(r["layer"]), str(r["blocks"]), _fmt(r["dram"], "ratio"),
                          _fmt(r["store"], "ratio"), _fmt(r["peer"], "ratio"), text,
                          hist[(f.metric, f.key)][1])
        if not layers:
            table.add_row("n/a", "", "", "", "", "no layer served yet", "")
        wait = kv_wait(sample, role)
        if wait is not None:  # the bubble the slack cannot show: before layer 0
            table.caption = (f"prefills waited {wait * 1e3:.2f} ms for their KV before layer 0 "
                             "(median over prefill engines; the whole hit loads first)")
            table.caption_justify = "left"
        return table
    table = Table(title=title, title_justify="left", expand=False)
    with_capacity = any(m.name in _CAPACITY for m in metrics)
    per_metric = [(m, rows_for(m, sample, by, role)) for m in metrics]
    open_findings = history.open_findings(sample)
    marks = {r.key: _mark(_covering(sample, faults, r), [
                 w for subj in _subjects(sample, r) for w in open_findings.get(subj, [])])
             for _, found in per_metric for r in found}
    cols = ["metric", "where", "role", "value", *(["capacity"] if with_capacity else []),
            "delta", "trend"]
    for col in cols:
        table.add_column(col, justify="right" if col in ("value", "delta", "capacity")
                         else "left")
    # a degraded part: its mark beside its name, what covers it under the table
    why = [f"{key} {mark} degraded: {words}" for key, (mark, words) in marks.items() if mark]
    if why:
        table.caption, table.caption_justify = "\n".join(why), "left"
    for m, found in per_metric:
        hist = history.push(found)
        for row in found:
            prev, spark = hist[(row.metric, row.key)]
            cap = _capacity(sample, row) if m.name in _CAPACITY else None
            mark = marks[row.key][0]
            where = (f"{escape(row.key)} [bold {'red' if mark == '!!' else 'yellow'}]{mark}[/]"
                     if mark else escape(row.key))
            cells = [m.name, where, row.role or "", _fmt(row.value, m.unit)]
            if with_capacity:
                cells.append("" if m.name not in _CAPACITY else
                             "n/a" if cap is None else format_bandwidth(cap))
            cells += [_fmt_delta(row.value, prev, m.unit), spark]
            table.add_row(*cells)
        if not found:
            table.add_row(m.name, "(none)", role or "", "n/a",
                          *([""] * (len(cols) - 4)))
    return table


def sample_json(sample: Sample, metrics: list[MonitorMetric], by: str | None,
                role: str | None, by_layer: bool, prev: dict[tuple[str, str], float | None],
                faults: tuple[Fault, ...] = ()) -> dict[str, Any]:
    """One JSON Lines object for a sample (``delta``: change since the previous sample;
    ``faults``: the ids of the faults in force on the row's part, ``degraded`` when any;
    ``capacity_bytes_per_s``: the storage NIC's rate beside its utilisation)."""
    obj: dict[str, Any] = {"at": sample.at, "pd": sample.view.pd, "state": sample.view.state}
    if by_layer:
        obj["layers"] = layer_rows(sample, role)
        obj["kv_wait_s"] = kv_wait(sample, role)
        return obj
    out: dict[str, Any] = {}
    for m in metrics:
        rows = rows_for(m, sample, by, role)
        items = []
        for r in rows:
            before = prev.get((r.metric, r.key))
            covering = _covering(sample, faults, r)
            item: dict[str, Any] = {"key": r.key, "role": r.role, "node": r.node,
                                    "engine": r.engine,
                                    "value": r.value,
                                    "delta": None if r.value is None or before is None
                                    else r.value - before,
                                    "degraded": bool(covering), "faults": [f.id for f in covering]}
            if m.name in _CAPACITY:
                item["capacity_bytes_per_s"] = _capacity(sample, r)
            items.append(item)
            prev[(r.metric, r.key)] = r.value
        out[m.name] = {"metric": m.metric, "unit": m.unit, "rows": items}
    obj["metrics"] = out
    return obj


# --- sources ---------------------------------------------------------------------------------
#: A sample and the injected faults in force then.
Look = tuple["Sample", tuple["Fault", ...]]


def live_samples(ref: ClusterRef, interval_s: float, with_metrics: bool,
                 count: int | None) -> Iterator[Look]:
    """Samples of a live cluster every ``interval_s`` (``count`` of them, or forever), each
    with the faults in force (``/api/v1/status``)."""
    from dualpath_cli.cli import source
    from dualpath_cli.telemetry.recording import Extras, Sample, extras_from_metrics_text

    with source.connect(ref, timeout=max(5.0, interval_s * 4)) as client:
        i = 0
        start = time.monotonic()
        while count is None or i < count:
            wait = start + i * interval_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            view = client.view()
            extras = (extras_from_metrics_text(client.metrics_text()) if with_metrics
                      else Extras())
            yield Sample(view.at, view, extras), tuple(client.status().faults)
            i += 1


def recorded_samples(path: Path) -> Iterator[Look]:
    """The samples of a recording, oldest first, each with the faults in force then (read
    off the recorded audit trail)."""
    from dualpath_cli.cli.output import warn
    from dualpath_cli.diagnose.degraded import faults_at
    from dualpath_cli.services.recording import read_recording

    rec = read_recording(path, on_cut=warn)
    for s in rec.samples:
        yield s, faults_at(rec.audit, s.at)


# --- the command -----------------------------------------------------------------------------
def monitor(
    metric: Annotated[list[str] | None, typer.Option(
        "--metric", "-m", help="A metric to watch (repeatable): " + ", ".join(MONITOR_METRICS)
        + ".")] = None,
    interval: Annotated[str, typer.Option("--interval", "-i", help="Time between samples, "
                                          "e.g. 500ms, 1s, 2m (at least 250ms).")] = "1s",
    count: Annotated[int | None, typer.Option("--count", "-n", min=1, help="Stop after N "
                                              "samples.")] = None,
    by_layer: Annotated[bool, typer.Option("--by-layer", help="One row per layer: share of "
                                           "blocks per tier and load-ahead slack.")] = False,
    by_engine: Annotated[bool, typer.Option("--by-engine", help="One row per engine.")] = False,
    by_node: Annotated[bool, typer.Option("--by-node", help="One row per node (engine "
                                          "metrics averaged).")] = False,
    role: Annotated[str | None, typer.Option("--role", help="Only prefill or decode "
                                             "engines/nodes.")] = None,
    url: UrlOption = None,
    port: PortOption = None,
    token_file: TokenFileOption = None,
    from_file: Annotated[Path | None, typer.Option("--from", help="Play a recording "
                                                   "(dualpath record) instead.")] = None,
    as_json: Annotated[bool, json_option("JSON Lines: one object per "
                                          "sample.")] = False,
    once: Annotated[bool, typer.Option("--once", help="One sample, then exit (automatic "
                                       "when stdout is not a terminal).")] = False,
    tui: Annotated[bool, typer.Option("--tui", help="Open the full-screen cockpit "
                                      "(dualpath top) on the same source.")] = False,
) -> None:
    """Watch metrics of a live cluster (or a recording), redrawn in place in a terminal."""
    from dualpath_cli.cli.source import ClusterRef

    ref = ClusterRef(url, port, token_file)
    if tui:
        from dualpath_cli.cli.top_cmd import run_top

        run_top(ref, from_file, interval)
        return
    names = list(metric or [])
    if not names:
        names = ["cache_hit"] if by_layer else ["hbm_frag"]
    metrics = [pick(MONITOR_METRICS, n, "metric") for n in names]
    interval_s = parse_interval(interval)
    if by_engine and by_node:
        raise UsageError("--by-engine and --by-node exclude each other")
    if role is not None and role not in ("prefill", "decode"):
        raise UsageError(f"--role {role!r}: choose prefill or decode")
    if from_file is not None and ref.named:
        raise UsageError(f"--from and {ref.named} exclude each other")
    by = "engine" if by_engine else "node" if by_node else None
    tty = sys.stdout.isatty()
    with_metrics = any(m.source == "metrics" for m in metrics) and not by_layer
    if from_file is not None:  # a recording plays whole unless --once/--count says otherwise
        samples: Iterator[Look] = recorded_samples(from_file)
        if once:
            samples, count = iter(list(samples)[-1:]), 1
        elif count is not None:
            samples = (s for _, s in zip(range(count), samples, strict=False))
    else:
        if once or (count is None and not tty):
            count = 1
        samples = live_samples(ref, interval_s, with_metrics, count)
    if as_json:
        from dualpath_cli.cli.output import emit_json

        prev: dict[tuple[str, str], float | None] = {}
        for s, faults in samples:
            emit_json(sample_json(s, metrics, by, role, by_layer, prev, faults))
        return
    from dualpath_cli.cli.output import stdout

    history = History()
    if not tty or count == 1:
        for s, faults in samples:
            stdout.print(render_table(s, metrics, by, role, history, by_layer, faults))
        return
    _live_loop(stdout, samples, metrics, by, role, history, by_layer)


def _live_loop(console: Console, samples: Iterator[Look], metrics: list[MonitorMetric],
               by: str | None, role: str | None, history: History, by_layer: bool) -> None:
    from rich.live import Live

    live: Live | None = None
    try:
        for s, faults in samples:
            table = render_table(s, metrics, by, role, history, by_layer, faults)
            if live is None:
                live = Live(table, console=console, auto_refresh=False, transient=False)
                live.start()
            live.update(table, refresh=True)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()


def register(app: typer.Typer) -> None:
    """Add ``monitor``, ``record`` and ``diagnose`` to the ``dualpath`` app."""
    from dualpath_cli.cli import diagnose_cmd, record_cmd

    app.command("monitor")(monitor)
    app.command("record")(record_cmd.record)
    diagnose_cmd.register(app)


@guard_stdout
def main(argv: list[str] | None = None) -> int:
    """The ``dualpath-monitor`` console script: one-line errors, exit codes as ``dualpath``."""
    import typer.core

    from dualpath_cli.cli.helptext import reflow_command
    from dualpath_cli.cli.output import fail
    from dualpath_cli.errors import EXIT_USAGE, DualPathError

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                      context_settings={"help_option_names": ["-h", "--help"]})
    app.command()(monitor)
    command = reflow_command(typer.main.get_command(app))
    click_mod = getattr(typer.core, "_click", None) or __import__("click")  # Typer >= 0.29
    try:
        code = command.main(args=argv, prog_name="dualpath-monitor", standalone_mode=False)
    except DualPathError as err:
        fail(str(err))
        return err.exit_code
    except click_mod.exceptions.ClickException as err:
        fail(f"dualpath-monitor: {err.format_message()} (see 'dualpath-monitor --help')")
        return int(err.exit_code or EXIT_USAGE)
    except (KeyboardInterrupt, getattr(click_mod.exceptions, "Abort", typer.Abort)):
        return 130
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
