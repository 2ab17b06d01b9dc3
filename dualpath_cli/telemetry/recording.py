"""A recording's data model: a window of a cluster (views, extras, decisions, served turns).

Why here, beside the view model: a recording is a sequence of views plus the decision log,
and the monitor, diagnose and the TUI read it the same way live or from last night. The
types and the line codecs are plain data, so readers below the services (tui/, diagnose/)
use them; opening, compressing, writing and sampling live live in services/recording.py
(``read_recording``, ``write_recording``, ``collect``).

File: JSON Lines, optionally compressed by suffix (``.gz`` gzip; ``.zst`` zstd when the
``zstandard`` module is importable). Lines, each an object with a ``kind``:

- ``header``: ``{"format": "dualpath-recording", "version": 1, "source", "interval_s", ...}``
- ``sample``: ``{"at", "view", "extras"[, "inflight"]}`` every interval; ``view`` is the
  ClusterView with
  its engines and nodes as columns (:func:`encode_view`; ``ClusterView.to_dict``'s form
  reads too);
  ``extras`` holds the facts only ``/metrics`` serves (TTFT histogram, host NIC errors and
  drops, prefetch accuracy, per-block read counts when the runtime reports them);
  ``inflight`` is ``GET /api/v1/requests?state=inflight``'s answer then (``total`` and the
  oldest :data:`INFLIGHT_PER_SAMPLE` turns; absent from older recordings and servers).
- ``decision``: one logged decision (``Decision`` fields).
- ``trace``: one line of the served turns as a dualpath trace (header first), see
  services/recording.py ``trace_from_decisions``.
- ``outcome``: ``{"rid", "story"}``, one finished request's story as ``GET
  /api/v1/requests/{id}`` served it (``dualpath explain --from``); the newest
  :data:`MAX_OUTCOMES` of the window. Readers that do not know a kind skip it, so older
  readers read newer files and a file without outcomes still reads.
- ``audit``: ``{"entries": [{"seq", "at", "token_id", "action", "old", "new"}, ...],
  "alpha_s_per_token"}``, once, after the window: the cluster's audit log
  (``/api/v1/status``) from the reach of a change before the first sample (one window
  length, at least diagnose/rules/thresholds.py ``CHANGE_REACH_MIN_S``) to the last sample,
  and alpha's seconds of reading per token then (status' ``alpha_s`` over ``alpha_tokens``; ``null``
  where the NICs have no rate), so a recorded change of alpha is named by its audit entry
  in the config's units. Absent from older recordings (and where the status could not be
  read): changes are then read off the samples' thresholds.
- ``end``: counts, written last (a file without it was cut short; it is still readable).

The recorder writes as the window goes (services/recording_stream.py), so ``decision`` and
``outcome`` lines follow the sample they were fetched with; readers take the kinds in any
order.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from dualpath_cli.errors import UsageError
from dualpath_cli.telemetry.view import (
    AuditEntry,
    ClusterView,
    Decision,
    EngineView,
    LayerHits,
    NodeView,
    decision_from_dict,
    view_from_dict,
)

__all__ = ["FORMAT", "VERSION", "Extras", "Sample", "Recording", "RecordedAudit",
           "RecordingError", "extras_from_dict", "extras_from_metrics_text", "sample_line",
           "decision_line", "json_line", "encode_view", "decode_view", "sample_from_line",
           "decision_from_line"]

FORMAT = "dualpath-recording"
VERSION = 1


class RecordingError(UsageError):
    """An unreadable recording (names the file, the line and the reason)."""


@dataclass(frozen=True, slots=True)
class Extras:
    """Facts of one sample that only ``/metrics`` serves (``None``/empty: not available).

    Args:
        ttft_buckets: the TTFT histogram as ``(upper bound, cumulative count)`` pairs.
        ttft_count / ttft_sum: its count and sum (turns since start, seconds).
        nic_errors / nic_drops: host NIC errors and drops since boot, all devices.
        prefetch_accuracy: by node (0..1).
        block_reads: store reads per block key since start, summed over nodes (hot-spot
            evidence); the runtime reports each engine's most-read blocks only.
        store_block_reads: Full Blocks read from the store since start, all nodes (what a
            block's reads are a share of); ``None`` when not reported.
        block_copy_reads: reads of a replicated block by the store root that served them
            (block key -> root -> reads since start, summed over nodes).
        cache_hit_ratio: hits over lookups by ``"<node>/<tier>"`` (the seed's cache_hit_ratio).
        prefetched_blocks: blocks read ahead by node since start (accuracy means nothing
            where it is 0).
        warm_blocks_remaining: blocks a warm-up has still to read, by node (empty: no
            engine has run one).
        node_store_reads: Full Blocks read from the store by node since start (what its
            failed reads are out of).
        node_read_errors: store reads that failed (EIO, timed out) by node since start.
        node_corrupt_blocks: blocks found corrupt and quarantined by node since start.
        node_write_errors: block writes the store refused, by ``"<node>/<reason>"`` (full,
            read_only, failed) since start.
        store_read_latency: by node, the store reads' latency since start as ``(seconds
            summed, reads)`` (``dualpath_storage_read_latency_seconds{tier="store"}``: each
            block from queued to delivered).
        store_read_service: by node, the store's service time of its read batches since
            start as ``(seconds summed, batches)``
            (``dualpath_storage_read_service_seconds``: the store's own time, without the
            wait in the read queue or the NIC's pacing); empty where not reported (an
            older recording or cluster).
        block_readers: store reads per block key since start, by the node that read them
            (the exported most-read blocks only; which node hammers a hot block).
    """

    ttft_buckets: tuple[tuple[float, int], ...] = ()
    ttft_count: int | None = None
    ttft_sum: float | None = None
    nic_errors: int | None = None
    nic_drops: int | None = None
    prefetch_accuracy: dict[int, float] = field(default_factory=dict)
    block_reads: dict[str, int] = field(default_factory=dict)
    cache_hit_ratio: dict[str, float] = field(default_factory=dict)
    prefetched_blocks: dict[int, int] = field(default_factory=dict)
    store_block_reads: int | None = None
    block_copy_reads: dict[str, dict[str, int]] = field(default_factory=dict)
    warm_blocks_remaining: dict[int, int] = field(default_factory=dict)
    node_store_reads: dict[int, int] = field(default_factory=dict)
    node_read_errors: dict[int, int] = field(default_factory=dict)
    node_corrupt_blocks: dict[int, int] = field(default_factory=dict)
    node_write_errors: dict[str, int] = field(default_factory=dict)
    store_read_latency: dict[int, tuple[float, int]] = field(default_factory=dict)
    store_read_service: dict[int, tuple[float, int]] = field(default_factory=dict)
    block_readers: dict[str, dict[int, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (inf bucket bound written as the string ``"+Inf"``)."""
        d = dataclasses.asdict(self)
        d["ttft_buckets"] = [["+Inf" if math.isinf(le) else le, c]
                             for le, c in self.ttft_buckets]
        return d


def extras_from_dict(data: dict[str, Any]) -> Extras:
    """:class:`Extras` from its JSON form."""
    return Extras(
        ttft_buckets=tuple((math.inf if le == "+Inf" else float(le), int(c))
                           for le, c in data.get("ttft_buckets", ())),
        ttft_count=data.get("ttft_count"), ttft_sum=data.get("ttft_sum"),
        nic_errors=data.get("nic_errors"), nic_drops=data.get("nic_drops"),
        prefetch_accuracy={int(k): float(v)
                           for k, v in (data.get("prefetch_accuracy") or {}).items()},
        block_reads={str(k): int(v) for k, v in (data.get("block_reads") or {}).items()},
        cache_hit_ratio={str(k): float(v)
                         for k, v in (data.get("cache_hit_ratio") or {}).items()},
        prefetched_blocks={int(k): int(v)
                           for k, v in (data.get("prefetched_blocks") or {}).items()},
        store_block_reads=data.get("store_block_reads"),
        block_copy_reads={str(k): {str(r): int(n) for r, n in v.items()}
                          for k, v in (data.get("block_copy_reads") or {}).items()},
        warm_blocks_remaining={int(k): int(v) for k, v in
                               (data.get("warm_blocks_remaining") or {}).items()},
        node_store_reads=_by_node(data.get("node_store_reads")),
        node_read_errors=_by_node(data.get("node_read_errors")),
        node_corrupt_blocks=_by_node(data.get("node_corrupt_blocks")),
        node_write_errors={str(k): int(v) for k, v in
                           (data.get("node_write_errors") or {}).items()},
        store_read_latency={int(k): (float(v[0]), int(v[1])) for k, v in
                            (data.get("store_read_latency") or {}).items()},
        store_read_service={int(k): (float(v[0]), int(v[1])) for k, v in
                            (data.get("store_read_service") or {}).items()},
        block_readers={str(k): {int(n): int(c) for n, c in v.items()}
                       for k, v in (data.get("block_readers") or {}).items()})


def _by_node(data: dict[str, Any] | None) -> dict[int, int]:
    return {int(k): int(v) for k, v in (data or {}).items()}


@dataclass(frozen=True, slots=True)
class Sample:
    """One look at the cluster: the view, and the extras from ``/metrics``."""

    at: float
    view: ClusterView
    extras: Extras = Extras()
    inflight: dict[str, Any] | None = None  # the in-flight listing then (None: not known)


@dataclass(frozen=True)
class Recording:
    """A window of a cluster: samples (oldest first), decisions (by seq), served turns."""

    header: dict[str, Any]
    samples: tuple[Sample, ...]
    decisions: tuple[Decision, ...]
    trace_lines: tuple[dict[str, Any], ...] = ()
    complete: bool = True
    stories: dict[int, dict[str, Any]] = field(default_factory=dict)  # rid -> finished story
    #: the audit entries in reach of the window (None: not recorded, an older recording)
    audit: tuple[AuditEntry, ...] | None = None
    #: alpha's seconds of reading per token (None: not recorded, or the NICs have no rate)
    alpha_s_per_token: float | None = None

    @property
    def window_s(self) -> float:
        """Seconds from the first to the last sample (0 with fewer than two)."""
        return self.samples[-1].at - self.samples[0].at if len(self.samples) > 1 else 0.0


@dataclass(frozen=True)
class RecordedAudit:
    """What a recording keeps of the cluster's audit log (the ``audit`` line).

    Args:
        entries: the audit entries in reach of the window, oldest first.
        alpha_s_per_token: seconds of reading per alpha token (``None``: unknown).
    """

    entries: tuple[AuditEntry, ...]
    alpha_s_per_token: float | None = None

    def to_line(self) -> dict[str, Any]:
        """The ``audit`` line's object."""
        return {"kind": "audit", "entries": [dataclasses.asdict(a) for a in self.entries],
                "alpha_s_per_token": self.alpha_s_per_token}

    @classmethod
    def from_line(cls, obj: dict[str, Any]) -> RecordedAudit:
        """From an ``audit`` line's object."""
        per = obj.get("alpha_s_per_token")
        return cls(tuple(AuditEntry(int(a["seq"]), float(a["at"]), str(a.get("token_id", "")),
                                    str(a["action"]), dict(a.get("old") or {}),
                                    dict(a.get("new") or {}))
                         for a in obj.get("entries") or ()),
                   float(per) if isinstance(per, int | float) and per > 0 else None)


def json_line(obj: dict[str, Any]) -> str:
    """One line of a recording: compact JSON (no NaN: a reader must parse it)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n"


_ENGINE_COLS = tuple(f.name for f in dataclasses.fields(EngineView))
_NODE_COLS = tuple(f.name for f in dataclasses.fields(NodeView))
_LAYERS_AT = _ENGINE_COLS.index("layers")
_ENGINE_FIELDS = frozenset(_ENGINE_COLS)
_NODE_FIELDS = frozenset(_NODE_COLS)


def encode_view(view: ClusterView) -> dict[str, Any]:
    """A view as stored in a recording: ``ClusterView.to_dict`` with the engines and nodes
    as columns (``{"cols": [...], "rows": [[...], ...]}``; a layer is ``[layer, dram, store,
    peer, slack_s]``).

    Why: 1,152 engines repeat the same 18 keys in every sample; as rows the file is about
    half the size and decodes positionally, several times faster.
    """
    engines = []
    for e in view.engines:
        row = [getattr(e, c) for c in _ENGINE_COLS]
        row[_LAYERS_AT] = [[h.layer, h.dram, h.store, h.peer, h.slack_s] for h in e.layers]
        engines.append(row)
    nodes = [[getattr(n, c) for c in _NODE_COLS] for n in view.nodes]
    for row in nodes:
        row[2] = list(row[2])
    sched = dataclasses.asdict(view.scheduler)
    # the membership record: diagnose's membership workflow and the names replay reads
    members = dataclasses.asdict(view.membership) if view.membership is not None else None
    return {"at": view.at, "state": view.state, "pd": view.pd, "model": view.model,
            "uptime_s": view.uptime_s, "scheduler": sched, "membership": members,
            "engines": {"cols": list(_ENGINE_COLS), "rows": engines},
            "nodes": {"cols": list(_NODE_COLS), "rows": nodes}}


def decode_view(data: dict[str, Any]) -> ClusterView:
    """A view from :func:`encode_view`'s form, or from ``ClusterView.to_dict``'s."""
    engines_in, nodes_in = data["engines"], data["nodes"]
    if not isinstance(engines_in, dict):
        return _fast_view(data)
    if tuple(engines_in["cols"]) == _ENGINE_COLS:
        engines = []
        for row in engines_in["rows"]:
            row[_LAYERS_AT] = tuple([LayerHits(*x) for x in row[_LAYERS_AT]])
            engines.append(EngineView(*row))
    else:  # another writer's columns (an older or newer version): by name, once per view
        cols = engines_in["cols"]
        known = [(i, c) for i, c in enumerate(cols) if c in _ENGINE_FIELDS]
        engines = []
        for row in engines_in["rows"]:
            kw = {c: row[i] for i, c in known}
            if "layers" in kw:
                kw["layers"] = tuple([LayerHits(*x[:5]) for x in kw["layers"]])
            engines.append(EngineView(**kw))
    if tuple(nodes_in["cols"]) == _NODE_COLS:
        nodes = []
        for row in nodes_in["rows"]:
            row[2] = tuple(row[2])
            nodes.append(NodeView(*row))
    else:
        known = [(i, c) for i, c in enumerate(nodes_in["cols"]) if c in _NODE_FIELDS]
        nodes = []
        for row in nodes_in["rows"]:
            kw = {c: row[i] for i, c in known}
            kw["engines"] = tuple(kw.get("engines", ()))
            nodes.append(NodeView(**kw))
    slim = view_from_dict({**data, "engines": [], "nodes": []})
    return dataclasses.replace(slim, engines=tuple(engines), nodes=tuple(nodes))


def sample_line(sample: Sample) -> str:
    """One ``sample`` line of a recording."""
    line = {"kind": "sample", "at": sample.at, "view": encode_view(sample.view),
            "extras": sample.extras.to_dict()}
    if sample.inflight is not None:
        line["inflight"] = sample.inflight
    return json_line(line)


def decision_line(d: Decision) -> str:
    """One ``decision`` line (the decision's own ``kind``, turn or control, is stored as
    ``decision_kind``: ``kind`` names the line)."""
    rec = dataclasses.asdict(d)
    kind = rec.pop("kind", None)
    if kind is not None:
        rec["decision_kind"] = kind
    return json_line({"kind": "decision", **rec})



def _fast_view(data: dict[str, Any]) -> ClusterView:
    """``view_from_dict`` without the per-field filtering when the keys are exactly ours.

    Why: a recording of 1,152 engines over 10 minutes holds ~700K engine records; building
    them through the generic filter costs seconds. Any mismatch falls back to the tolerant
    decoder, so a newer writer's extra keys still read.
    """
    try:
        engines = tuple(
            EngineView(**{**e, "layers": tuple(LayerHits(**x) for x in e["layers"])})
            for e in data["engines"])
        nodes = tuple(NodeView(**{**n, "engines": tuple(n["engines"])})
                      for n in data["nodes"])
    except TypeError:
        return view_from_dict(data)
    slim = {**data, "engines": [], "nodes": []}
    view = view_from_dict(slim)
    return dataclasses.replace(view, engines=engines, nodes=nodes)



def decision_from_line(obj: dict[str, Any]) -> Decision:
    """A decision line: its fields straight into :class:`Decision` when they are exactly
    ours (12,000 decisions through the tolerant decoder cost a second), else by name."""
    try:
        return Decision(**obj)
    except TypeError:
        return decision_from_dict(obj)


def sample_from_line(obj: dict[str, Any]) -> Sample:
    inflight = obj.get("inflight")
    return Sample(float(obj["at"]), decode_view(obj["view"]),
                  extras_from_dict(obj.get("extras") or {}),
                  inflight if isinstance(inflight, dict) else None)


# --- /metrics extras -------------------------------------------------------------------------
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _labels(text: str | None) -> dict[str, str]:
    return dict(_LABEL.findall(text or ""))


def extras_from_metrics_text(text: str) -> Extras:
    """The :class:`Extras` in a Prometheus exposition (families absent: not available)."""
    buckets: dict[float, int] = {}
    count: int | None = None
    total: float | None = None
    errors: int | None = None
    drops: int | None = None
    prefetch: dict[int, float] = {}
    blocks: dict[str, int] = {}
    hits: dict[str, float] = {}
    prefetched: dict[int, int] = {}
    store_reads: int | None = None
    copy_reads: dict[str, dict[str, int]] = {}  # block -> root -> reads
    warm: dict[int, int] = {}  # node -> blocks a warm-up has still to read
    per_node: dict[str, dict[int, int]] = {name: {} for name in _PER_NODE}
    write_errors: dict[str, int] = {}
    latency: dict[int, list[float]] = {}  # node -> [seconds, reads] of store reads
    service: dict[int, list[float]] = {}  # node -> [seconds, batches] of the store's service
    readers: dict[str, dict[int, int]] = {}  # block -> node -> reads
    for line in text.splitlines():
        if not line.startswith("dualpath_"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name, labels, raw = m.group(1), m.group(2), m.group(3)
        try:
            value = float(raw)
        except ValueError:
            continue
        if name in _PER_NODE:  # also read below (read_blocks_total: all nodes)
            node = _labels(labels).get("node")
            if node is not None and node.lstrip("-").isdigit():
                into = per_node[name]
                into[int(node)] = into.get(int(node), 0) + int(value)
        if name == "dualpath_ttft_seconds_bucket":
            le = _labels(labels).get("le", "+Inf")
            buckets[math.inf if le == "+Inf" else float(le)] = int(value)
        elif name == "dualpath_ttft_seconds_count":
            count = int(value)
        elif name == "dualpath_ttft_seconds_sum":
            total = value
        elif name == "dualpath_host_nic_errors_total":
            errors = (errors or 0) + int(value)
        elif name == "dualpath_host_nic_drops_total":
            drops = (drops or 0) + int(value)
        elif name == "dualpath_prefetch_accuracy_ratio" and math.isfinite(value):
            node = _labels(labels).get("node")
            if node is not None and node.lstrip("-").isdigit():
                prefetch[int(node)] = value
        elif name == "dualpath_storage_cache_hit_ratio" and math.isfinite(value):
            lab = _labels(labels)
            hits[f"{lab.get('node', '?')}/{lab.get('tier', '?')}"] = value
        elif name == "dualpath_storage_prefetched_blocks_total":
            node = _labels(labels).get("node")
            if node is not None and node.lstrip("-").isdigit():
                prefetched[int(node)] = int(value)
        elif name == "dualpath_storage_block_reads_total":
            key = _labels(labels).get("block")
            if key:  # one series per node that reads the block
                blocks[key] = blocks.get(key, 0) + int(value)
                node = _labels(labels).get("node")
                if node is not None and node.lstrip("-").isdigit():
                    read_by = readers.setdefault(key, {})
                    read_by[int(node)] = read_by.get(int(node), 0) + int(value)
        elif name in ("dualpath_storage_read_latency_seconds_sum",
                      "dualpath_storage_read_latency_seconds_count"):
            lab = _labels(labels)
            node = lab.get("node")
            if lab.get("tier") == "store" and node is not None and node.lstrip("-").isdigit():
                acc = latency.setdefault(int(node), [0.0, 0.0])
                acc[0 if name.endswith("_sum") else 1] += value
        elif name in ("dualpath_storage_read_service_seconds_sum",
                      "dualpath_storage_read_service_seconds_count"):
            node = _labels(labels).get("node")
            if node is not None and node.lstrip("-").isdigit():
                acc = service.setdefault(int(node), [0.0, 0.0])
                acc[0 if name.endswith("_sum") else 1] += value
        elif name == "dualpath_storage_read_blocks_total":
            store_reads = (store_reads or 0) + int(value)
        elif name == "dualpath_storage_warm_blocks_remaining":
            node = _labels(labels).get("node")
            if node is not None and node.lstrip("-").isdigit():
                warm[int(node)] = warm.get(int(node), 0) + int(value)
        elif name == "dualpath_storage_write_errors_total":
            lab = _labels(labels)
            key = f"{lab.get('node', '?')}/{lab.get('reason', 'failed')}"
            write_errors[key] = write_errors.get(key, 0) + int(value)
        elif name == "dualpath_storage_block_copy_reads_total":
            lab = _labels(labels)
            per_root = copy_reads.setdefault(lab.get("block", "?"), {})
            root = lab.get("root", "?")
            per_root[root] = per_root.get(root, 0) + int(value)
    return Extras(tuple(sorted(buckets.items())), count, total, errors, drops, prefetch,
                  blocks, hits, prefetched, store_reads, copy_reads, warm,
                  node_store_reads=per_node["dualpath_storage_read_blocks_total"],
                  node_read_errors=per_node["dualpath_storage_read_errors_total"],
                  node_corrupt_blocks=per_node["dualpath_storage_corrupt_blocks_total"],
                  node_write_errors=write_errors,
                  store_read_latency={n: (s, int(c)) for n, (s, c) in latency.items()},
                  store_read_service={n: (s, int(c)) for n, (s, c) in service.items()},
                  block_readers=readers)


#: Per-node counters the storage-health rules read, summed over their other labels.
_PER_NODE = ("dualpath_storage_read_blocks_total", "dualpath_storage_read_errors_total",
             "dualpath_storage_corrupt_blocks_total")
