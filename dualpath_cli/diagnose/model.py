"""Findings, reports and the evidence bundle the rules read.

Why a bundle: every workflow looks at the same window (samples oldest first, decisions by
seq); per-engine and per-node series are extracted once and cached here, so ``diagnose all``
over 1,152 engines and 600 samples walks the views a few times, not once per rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property
from operator import attrgetter
from typing import Any, TypeVar

from dualpath_cli.services.recording import Sample
from dualpath_cli.telemetry.view import ClusterView, Decision, EngineView, NodeView

__all__ = ["Severity", "Finding", "Report", "Evidence", "node_name", "engine_name",
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
    """

    workflow: str
    severity: Severity
    title: str
    subject: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    cause: str | None = None
    action: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (severity by name)."""
        return {"workflow": self.workflow, "severity": self.severity.name,
                "title": self.title, "subject": self.subject, "evidence": self.evidence,
                "cause": self.cause, "action": self.action}


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
    """``P0`` / ``D1``: the role's letter and the node id (how the operator stories name nodes)."""
    if isinstance(node, NodeView):
        return f"{'P' if node.role == 'prefill' else 'D'}{node.node}"
    if isinstance(node, EngineView):
        return f"{'P' if node.role == 'prefill' else 'D'}{node.node}"
    return f"{'P' if role == 'prefill' else 'D'}{node}"


def engine_name(engine: EngineView) -> str:
    """``engine 3 (decode, node D1)``."""
    return f"engine {engine.engine_id} ({engine.role}, node {node_name(engine)})"


class Evidence:
    """A window of samples and decisions, with series extracted once.

    Args:
        samples: oldest first (at least one for any verdict).
        decisions: the decisions logged in the window.
    """

    def __init__(self, samples: Sequence[Sample], decisions: Sequence[Decision] = ()) -> None:
        self.samples = tuple(samples)
        self.decisions = tuple(d for d in decisions if d.kind == "turn")  # not controller moves

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
    def alpha_series(self) -> list[int]:
        """alpha in force (tokens) at each sample."""
        return [s.view.scheduler.thresholds.alpha_tokens for s in self.samples]

    @cached_property
    def beta_series(self) -> list[int]:
        """beta in force (tokens) at each sample."""
        return [s.view.scheduler.thresholds.beta_tokens for s in self.samples]
