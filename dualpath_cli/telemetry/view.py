"""ClusterView: the typed, immutable read model of a running system.

Why one type: the HTTP API serves it (as JSON and as Prometheus text), recordings are
sequences of it, and the monitor, the TUI and diagnose read it, live or from a recording,
through one shape. It is plain data (frozen dataclasses of numbers and strings), so it can
be built by the runtime, decoded from JSON by a client that never imports the runtime, or
made by hand in a test.

"Not available" is ``None`` everywhere (JSON ``null``), never NaN, never a sentinel such as
-1: a value the system does not know (an engine that has not reported yet, a GPU fact on a
machine without NVML) is ``None`` and front-ends print it as ``n/a``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dualpath_cli.telemetry.membership import Membership, membership_from_dict

__all__ = ["fields_of", "NA", "na", "fmt_na", "LayerHits", "EngineView", "NodeView", "Thresholds",
           "DecisionCounts", "LatencyHistogram", "SchedulerView", "Decision", "AuditEntry",
           "ClusterView", "view_from_dict", "decision_from_dict"]

#: How front-ends print a value that is not available.
NA = "n/a"

T = TypeVar("T")


def na(value: float | int | None) -> float | int | None:
    """``value``, or ``None`` when it is NaN/inf (so NaN never leaves the producer)."""
    if value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def fmt_na(value: object, fmt: str = "{}") -> str:
    """``fmt.format(value)`` or ``n/a`` for ``None``."""
    return NA if value is None else fmt.format(value)


@dataclass(frozen=True, slots=True)
class LayerHits:
    """Layer Blocks one engine got for one layer, by tier (counts since start).

    Tiers: ``dram`` (the node's loader buffer cache), ``store`` (read through the storage
    NIC) and ``peer`` (received over the compute network from the other engine's buffer).
    ``slack_s`` is the load-ahead slack of the layer's last prefill: seconds its blocks were
    ready before its compute began (negative: a bubble); ``None`` until measured.
    """

    layer: int
    dram: int = 0
    store: int = 0
    peer: int = 0
    slack_s: float | None = None


@dataclass(frozen=True, slots=True)
class EngineView:
    """One engine as the scheduler sees it at snapshot time.

    Args:
        engine_id / role / node / group: identity (role is ``prefill`` or ``decode``).
        state: ``starting`` (no hello yet), ``ready``, ``dead`` or ``draining``.
        pid: process id (``None`` for an in-process engine or before hello).
        seq: unfinished requests assigned to the engine.
        tokens: total tokens of those requests (the scheduler's ``tok``).
        read_queue_tokens / read_queue_bytes: the engine's node loader queue, as last reported.
        hbm_used_bytes / hbm_free_bytes / hbm_fragmentation: the KV pool (score 0..1).
        hbm_largest_free_blocks: the largest run of free HBM blocks.
        nic_bytes: bytes through this engine's NICs by ``"<nic>_<direction>"``
            (e.g. ``snic_read``, ``cnic_tx``).
        layers: per-layer hits by tier (empty until the engine has served a layer).
        gpu_utilization: busy fraction 0..1 over the last window of about a second
            (``None`` when not measured yet).
        heartbeat_age_s: seconds since the engine was last heard from.
        service_time_s: busy seconds per batched request over that window (a decode step
            or a prefill batch item; ``None`` when it ran nothing): a slow engine's is high.
        node_name: the operator's name of its node (``--node D0``; ``P0``/``D0`` in a
            launch); ``None`` from an older server.
        kv_wait_s: over that window, the mean time the engine's prefills of a cached prefix
            waited from their arrival for their KV before they could compute (the runtime
            loads a prefill's whole hit first, so a slow store read shows here, not in the
            per-layer slack); ``None`` when there was none, and on decode engines.
        kv_lost_turns: turns since it (re)started that were run again because a KV message
            on its compute-fabric link was lost (its link down, or its peer's), counted
            against the engine the loss is on.
    """

    engine_id: int
    role: str
    node: int
    group: int
    state: str
    pid: int | None = None
    seq: int = 0
    tokens: int = 0
    read_queue_tokens: int | None = None
    read_queue_bytes: int | None = None
    hbm_used_bytes: int | None = None
    hbm_free_bytes: int | None = None
    hbm_fragmentation: float | None = None
    hbm_largest_free_blocks: int | None = None
    nic_bytes: dict[str, int] = field(default_factory=dict)
    layers: tuple[LayerHits, ...] = ()
    gpu_utilization: float | None = None
    heartbeat_age_s: float | None = None
    service_time_s: float | None = None
    kv_wait_s: float | None = None
    node_name: str | None = None  # the operator's name of its node (``--node D0``)
    kv_lost_turns: int = 0  # turns run again because KV on its fabric link was lost


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node: its NICs, its loader queue and its DRAM buffer.

    Utilisations are 0..1 of the configured bandwidth (``None`` when unshaped or not yet
    measured).
    """

    node: int
    role: str
    engines: tuple[int, ...]
    snic_utilization: float | None = None
    cnic_utilization: float | None = None
    snic_bandwidth_bytes_per_s: float | None = None
    read_queue_tokens: int | None = None
    read_queue_bytes: int | None = None
    read_queue_blocks: int | None = None
    dram_buffer_bytes: int | None = None
    storage_read_bytes: int | None = None
    name: str | None = None  # the operator's name (``--node D0``); None: an older server

    @property
    def label(self) -> str:
        """How front-ends name the node: its operator's name, else ``node N``."""
        return self.name or f"node {self.node}"


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Thresholds in force, in scheduler units (tokens; quota in seconds), with their source.

    ``source`` says where each came from: ``config``, ``flag``, ``api`` (a PATCH),
    ``controller`` (a dynamic controller) or ``default``. ``controllers`` says, per dynamic
    controller (``alpha``, ``beta``, ``quota``), whether it is on, its bounds and its last
    step with the signal it read (``core.controllers.Controllers.state``).
    """

    alpha_tokens: int
    beta_tokens: int
    z_factor: float
    quota_s: float
    read_side: str
    source: dict[str, str] = field(default_factory=dict)
    controllers: dict[str, Any] = field(default_factory=dict)
    #: alpha as seconds of reading at one node's storage NICs (the config's unit), where the
    #: API knows the NIC rate (``/api/v1/status``); None in views that do not carry it
    alpha_s: float | None = None

    @property
    def alpha_s_per_token(self) -> float | None:
        """Seconds of reading one alpha token stands for (``alpha_s / alpha_tokens``), to
        write any alpha as the config gives it; None where ``alpha_s`` is not known."""
        return (self.alpha_s / self.alpha_tokens if self.alpha_s and self.alpha_tokens
                else None)


@dataclass(frozen=True, slots=True)
class DecisionCounts:
    """Scheduling decisions since start, by class and by read side.

    ``pe_class``: PE-fetch classes C1/C2/C3 of the chosen PE (paper 6.2); ``de_class``:
    ``normal`` or ``high_token`` for DE placement (the Z rule); ``side``: ``pe``, ``de`` or
    ``split``.
    """

    total: int = 0
    pe_class: dict[str, int] = field(default_factory=dict)
    de_class: dict[str, int] = field(default_factory=dict)
    side: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LatencyHistogram:
    """A latency histogram since start: ``count`` observations summing to ``sum_s`` seconds,
    and ``buckets`` as ``(upper bound s, cumulative count)`` pairs for the finite bounds (the
    ``+Inf`` bucket is ``count``; kept finite so the JSON form is plain JSON)."""

    count: int = 0
    sum_s: float = 0.0
    buckets: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True, slots=True)
class SchedulerView:
    """The global scheduler: queues, thresholds, what it decided, and what deciding costs.

    ``cpu_s`` is the CPU seconds its service thread used since start (``None`` from a server
    that does not measure it): over a window, the cores the scheduler needs.
    ``decision_latency`` is the wall time of its scheduling calls that found work, by kind
    (``de_fetch``, ``pe_fetch``).
    """

    policy: str
    fifo_length: int
    private_queues: dict[int, int]
    pe_queue_length: int
    in_flight: int
    thresholds: Thresholds
    decisions: DecisionCounts
    last_decision_seq: int | None = None
    requeued_total: int = 0
    cpu_s: float | None = None
    decision_latency: dict[str, LatencyHistogram] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decision:
    """One logged scheduling decision: its sequence number, outcome and inputs.

    ``inputs`` is the decision's inputs as they were before it (queue heads, engine
    snapshots, read queues, thresholds); kept as a mapping because it is evidence, read by
    people and by diagnose rules, not by the scheduler. ``kind`` is ``turn`` (a turn's
    placement) or ``control`` (a dynamic controller moved a threshold: ``side`` names the
    controller, the turn fields are -1/0 and ``inputs`` holds its signal, old and new value
    and bounds). ``gen`` is the tokens the turn generates (the runtime decodes exactly that
    many; ``None`` from a server that did not record it).
    """

    seq: int
    at: float
    rid: int
    attempt: int
    agent: int
    turn: int
    length: int
    cached: int
    pe: int
    de: int
    de_group: int
    side: str
    pe_tokens: int
    de_tokens: int
    pe_read_q: int
    de_read_q: int
    pe_class: str | None = None
    de_class: str | None = None
    z: float | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    kind: str = "turn"
    gen: int | None = None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One accepted control change: when, by which token id, old and new values.

    Here, beside the view, because the live service writes it and the API client reads it
    back, and the client must not import the service.
    """

    seq: int
    at: float
    token_id: str
    action: str
    old: dict[str, Any]
    new: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ClusterView:
    """A snapshot of the whole system at ``at`` (wall-clock seconds since the epoch).

    ``state`` is ``starting``, ``ready``, ``draining`` or ``stopped``; ``ready`` only when
    every engine that is still the cluster's has said hello. ``membership`` (None in an
    older recording) says what serves now and which role has no serving engine: the
    cluster is ready to serve only when ``state`` is ``ready`` and it is complete.
    ``started_at`` is wall-clock start; ``uptime_s`` seconds
    since then.
    """

    at: float
    state: str
    pd: str
    model: str
    uptime_s: float
    engines: tuple[EngineView, ...]
    nodes: tuple[NodeView, ...]
    scheduler: SchedulerView
    membership: Membership | None = None  # what serves beside what was configured

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``None`` stays ``None``; tuples become lists)."""
        return dataclasses.asdict(self)

    def engine(self, engine_id: int) -> EngineView:
        """The engine with ``engine_id`` (KeyError naming it when absent)."""
        for e in self.engines:
            if e.engine_id == engine_id:
                return e
        raise KeyError(f"no engine {engine_id} in this view")


def fields_of(cls: type[T], data: dict[str, Any]) -> T:
    """``cls`` from the keys of ``data`` it has fields for (a newer server's extra keys are
    left out): the one way the read model's records are built from their JSON form."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names})


def _int_keys(d: dict[Any, int]) -> dict[int, int]:
    return {int(k): int(v) for k, v in d.items()}


def decision_from_dict(data: dict[str, Any]) -> Decision:
    """A :class:`Decision` from its JSON form (unknown keys ignored)."""
    return fields_of(Decision, data)


def view_from_dict(data: dict[str, Any]) -> ClusterView:
    """A :class:`ClusterView` from its JSON form (``ClusterView.to_dict`` or the API).

    Unknown keys are ignored so an older client reads a newer server's views.
    """
    engines = tuple(
        fields_of(EngineView, {**e, "layers": tuple(fields_of(LayerHits, x)
                                                 for x in e.get("layers", ()))})
        for e in data["engines"])
    nodes = tuple(fields_of(NodeView, {**n, "engines": tuple(n.get("engines", ()))})
                  for n in data["nodes"])
    s = data["scheduler"]
    sched = fields_of(SchedulerView, {
        **s, "private_queues": _int_keys(s.get("private_queues", {})),
        "thresholds": fields_of(Thresholds, s["thresholds"]),
        "decisions": fields_of(DecisionCounts, s.get("decisions", {})),
        "decision_latency": {str(k): LatencyHistogram(
            int(h.get("count", 0)), float(h.get("sum_s", 0.0)),
            tuple((float(le), int(c)) for le, c in h.get("buckets", ())))
            for k, h in (s.get("decision_latency") or {}).items()}})
    return fields_of(ClusterView, {**data, "engines": engines, "nodes": nodes,
                                "scheduler": sched,
                                "membership": membership_from_dict(data.get("membership"))})
