"""Findings, reports and the evidence bundle the rules read.

Why a bundle: every workflow looks at the same window (samples oldest first, decisions by
seq); per-engine and per-node series are extracted once and cached here, so ``diagnose all``
over 1,152 engines and 600 samples walks the views a few times, not once per rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property
from operator import attrgetter
from typing import Any, TypeVar

from dualpath_cli.telemetry.recording import Sample
from dualpath_cli.telemetry.view import AuditEntry, ClusterView, Decision, EngineView, NodeView

__all__ = ["Severity", "Finding", "Report", "Evidence", "Change", "node_name", "engine_name",
           "ENGINE_SERIES"]

T = TypeVar("T")
#: Engine attributes the rules read as series; extracted together in one pass.
ENGINE_SERIES = ("seq", "tokens", "gpu_utilization", "hbm_fragmentation", "service_time_s",
                 "kv_wait_s")


class Severity(IntEnum):
    """Finding severity; the value is the exit code (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN)."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3


@dataclass(frozen=True)
class Finding:
    """One thing a workflow found.

    Args:
        workflow: the workflow that found it (``snic-imbalance``, ...).
        severity: OK (a check passed, or a fact), WARNING, CRITICAL, UNKNOWN (no evidence).
        title: one line with the numbers (``node D1 storage NIC at 25% of expected``).
        subject: what it is about (``node D1``, ``engine 3``, ``block 7f3a``), if one thing.
        evidence: the numbers behind it, for ``--json`` and for people.
        cause: the likely cause.
        action: the recommended action, as the exact command when there is one.
        rule: the graded rule behind the severity (diagnose/verdict.py), if one.
        why: why it has its grade: the rule's value, its evidence count and thresholds.
    """

    workflow: str
    severity: Severity
    title: str
    subject: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    cause: str | None = None
    action: str | None = None
    rule: str | None = None
    why: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (severity by name)."""
        return {"workflow": self.workflow, "severity": self.severity.name,
                "title": self.title, "subject": self.subject, "evidence": self.evidence,
                "cause": self.cause, "action": self.action, "rule": self.rule,
                "why": self.why}


@dataclass(frozen=True)
class Report:
    """A workflow's findings over a window; ``severity`` is the worst of them."""

    workflow: str
    findings: tuple[Finding, ...]
    window_s: float
    samples: int
    decisions: int

    @property
    def severity(self) -> Severity:
        """The worst finding (OK when there are none)."""
        return max((f.severity for f in self.findings), default=Severity.OK)

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"workflow": self.workflow, "severity": self.severity.name,
                "exit_code": int(self.severity), "window_s": self.window_s,
                "samples": self.samples, "decisions": self.decisions,
                "findings": [f.to_dict() for f in self.findings]}


def node_name(node: NodeView | EngineView | int, role: str | None = None) -> str:
    """The operator's name of a node (``--node D0``; ``P0``/``D0`` in a launch), as the
    membership record has it; from a view without names, the role's letter and the node id."""
    if isinstance(node, NodeView):
        return node.name or f"{'P' if node.role == 'prefill' else 'D'}{node.node}"
    if isinstance(node, EngineView):
        return node.node_name or f"{'P' if node.role == 'prefill' else 'D'}{node.node}"
    return f"{'P' if role == 'prefill' else 'D'}{node}"


def engine_name(engine: EngineView) -> str:
    """``engine 3 (decode, node D1)``."""
    return f"engine {engine.engine_id} ({engine.role}, node {node_name(engine)})"


@dataclass(frozen=True)
class Change:
    """A change of a threshold that steers reads (alpha or the read side).

    Args:
        at: when it took effect (wall clock).
        what: ``alpha`` (tokens) or ``read_side``.
        old: the value before (``None``: not recorded).
        new: the value after.
        by: ``audit`` (a PATCH: ``tune set``, ``tune rollback``, the TUI), ``controller`` (a
            dynamic controller's step, from the decision log) or ``samples`` (seen only as
            the thresholds of two samples differing: a recording holds no audit log).
        seq: the audit entry's seq (``by`` audit) or the control decision's (controller).
        source: for ``samples``, the thresholds' own source then (``api``, ``controller``).
    """

    at: float
    what: str
    old: Any
    new: Any
    by: str
    seq: int | None = None
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"at": self.at, "what": self.what, "old": self.old, "new": self.new,
                "by": self.by, "seq": self.seq, "source": self.source}


#: Audit ``old``/``new`` keys that change how reads are steered (the server writes scheduler
#: units, ``alpha_tokens``; the API's fake the PATCH field names) -> Change.what.
_STEERING_KEYS = {"alpha_tokens": "alpha", "alpha": "alpha", "read_side": "read_side"}


class Evidence:
    """A window of samples and decisions, with series extracted once.

    Args:
        samples: oldest first (at least one for any verdict).
        decisions: the decisions logged in the window.
        audit: the cluster's audit log (``/api/v1/status``), where known: live, not from a
            recording (there threshold changes are read off the samples' thresholds).
        earlier: decisions logged before the window (the server's ring), so a change made
            shortly before it can be judged against the reads before the change.
        alpha_s_per_token: seconds of reading per alpha token (status' ``alpha_s`` over
            ``alpha_tokens``), to write alpha as the config gives it; None: as tokens.
        previous: the previous verdicts of the graded rules on this cluster, by
            ``verdict.verdict_key`` (``None``: none known); the rules' hysteresis keeps a
            grade while its value stays inside the band around a threshold.
        read_history: each node's cumulative store-read counts at moments before the window
            (diagnose/read_history.py; kept by earlier diagnose runs on this cluster), so
            store-latency can grade a node's last reads when the window holds too few.
        service_history: the same for the store's service time (cumulative seconds summed
            and read batches), which store-latency grades where the cluster reports it.
    """

    def __init__(self, samples: Sequence[Sample], decisions: Sequence[Decision] = (), *,
                 audit: Sequence[AuditEntry] | None = None, earlier: Sequence[Decision] = (),
                 alpha_s_per_token: float | None = None,
                 previous: Mapping[str, Severity] | None = None,
                 read_history: Mapping[int, Sequence[tuple[float, float, int]]] | None = None,
                 service_history: Mapping[int, Sequence[tuple[float, float, int]]] | None = None
                 ) -> None:
        self.samples = tuple(samples)
        self.decisions = tuple(d for d in decisions if d.kind == "turn")  # not controller moves
        first = min((d.seq for d in decisions), default=None)
        before = tuple(d for d in earlier if first is None or d.seq < first)
        #: turn decisions logged before the window, oldest first
        self.earlier = tuple(d for d in before if d.kind == "turn")
        #: controller moves (``kind`` control) before and in the window, oldest first
        self.controls = tuple(d for d in (*before, *decisions) if d.kind == "control")
        self.audit = None if audit is None else tuple(audit)
        self.alpha_s_per_token = alpha_s_per_token
        self.previous = None if previous is None else dict(previous)
        self.read_history: dict[int, list[tuple[float, float, int]]] = {
            n: list(h) for n, h in (read_history or {}).items()}
        self.service_history: dict[int, list[tuple[float, float, int]]] = {
            n: list(h) for n, h in (service_history or {}).items()}

    @classmethod
    def from_views(cls, views: Sequence[ClusterView],
                   decisions: Sequence[Decision] = ()) -> Evidence:
        """Evidence from bare views (no /metrics extras): what tests build by hand."""
        return cls([Sample(v.at, v) for v in views], decisions)

    @property
    def views(self) -> tuple[ClusterView, ...]:
        """The views, oldest first."""
        return tuple(s.view for s in self.samples)

    @property
    def last(self) -> ClusterView:
        """The newest view."""
        return self.samples[-1].view

    @property
    def window_s(self) -> float:
        """Seconds between the first and the last sample."""
        return self.samples[-1].at - self.samples[0].at if len(self.samples) > 1 else 0.0

    @cached_property
    def engines(self) -> dict[int, EngineView]:
        """Each engine as last seen."""
        out: dict[int, EngineView] = {}
        for s in self.samples:
            for e in s.view.engines:
                out[e.engine_id] = e
        return out

    @cached_property
    def nodes(self) -> dict[int, NodeView]:
        """Each node as last seen."""
        out: dict[int, NodeView] = {}
        for s in self.samples:
            for n in s.view.nodes:
                out[n.node] = n
        return out

    def engine_series(self, attr: str) -> dict[int, list[Any]]:
        """``attr`` of every engine in every sample (``None`` kept), by engine id.

        The scalar attributes the rules read are extracted together in one pass over the
        window (:data:`ENGINE_SERIES`); any other attribute takes a pass of its own.
        """
        cache = self.__dict__.setdefault("_eseries", {})
        if attr not in cache:
            names = ENGINE_SERIES if attr in ENGINE_SERIES else (attr,)
            get = attrgetter("engine_id", *names)
            columns: dict[int, list[list[Any]]] = {}
            for s in self.samples:
                for e in s.view.engines:
                    row = get(e)
                    cols = columns.get(row[0])
                    if cols is None:
                        cols = columns[row[0]] = [[] for _ in names]
                    for col, value in zip(cols, row[1:], strict=True):
                        col.append(value)
            for i, name in enumerate(names):
                cache[name] = {eid: cols[i] for eid, cols in columns.items()}
        return cache[attr]

    def memo(self, key: str, compute: Callable[[], T]) -> T:
        """``compute()`` once per evidence (a rule another workflow reuses)."""
        cache = self.__dict__.setdefault("_memo", {})
        if key not in cache:
            cache[key] = compute()
        return cache[key]

    def node_series(self, attr: str) -> dict[int, list[Any]]:
        """``attr`` of every node in every sample (``None`` kept), by node id."""
        cache = self.__dict__.setdefault("_nseries", {})
        if attr not in cache:
            out: dict[int, list[Any]] = {}
            for s in self.samples:
                for n in s.view.nodes:
                    out.setdefault(n.node, []).append(getattr(n, attr))
            cache[attr] = out
        return cache[attr]

    @cached_property
    def changes(self) -> tuple[Change, ...]:
        """Changes of alpha or the read side, oldest first: the audit log's scheduler
        entries and the controllers' moves; without an audit log (a recording), also the
        samples whose thresholds differ from the sample before (at the first decision made
        under the new alpha between the two, else the later sample), unless a controller
        move logged between them explains it."""
        out: list[Change] = []
        for a in self.audit or ():
            if a.action != "scheduler":
                continue
            seen: set[str] = set()
            for key, what in _STEERING_KEYS.items():
                if key in a.new and what not in seen and a.new[key] != a.old.get(key):
                    seen.add(what)
                    out.append(Change(a.at, what, a.old.get(key), a.new[key], "audit", a.seq))
        for d in self.controls:
            if d.side == "alpha" and d.inputs.get("new") != d.inputs.get("old"):
                out.append(Change(d.at, "alpha", d.inputs.get("old"), d.inputs.get("new"),
                                  "controller", d.seq))
        if self.audit is None:
            out.extend(self._sample_changes())
        out.sort(key=lambda c: c.at)
        return tuple(out)

    def _sample_changes(self) -> list[Change]:
        out: list[Change] = []
        for prev, cur in zip(self.samples, self.samples[1:], strict=False):
            p, c = prev.view.scheduler.thresholds, cur.view.scheduler.thresholds
            for what, was, now in (("alpha", p.alpha_tokens, c.alpha_tokens),
                                   ("read_side", p.read_side, c.read_side)):
                if now == was or (what == "alpha" and any(
                        prev.at < d.at <= cur.at and d.side == "alpha" for d in self.controls)):
                    continue  # unchanged, or a controller's move (logged with its time)
                # decisions log the thresholds they were made under: the first under the new
                at = next((d.at for d in self.decisions if prev.at < d.at <= cur.at
                           and d.inputs.get(what) == now), cur.at)
                out.append(Change(at, what, was, now, "samples", source=c.source.get(what)))
        return out

    @cached_property
    def alpha_series(self) -> list[int]:
        """alpha in force (tokens) at each sample."""
        return [s.view.scheduler.thresholds.alpha_tokens for s in self.samples]

    @cached_property
    def beta_series(self) -> list[int]:
        """beta in force (tokens) at each sample."""
        return [s.view.scheduler.thresholds.beta_tokens for s in self.samples]
