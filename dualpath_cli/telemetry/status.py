"""The typed record of ``GET /api/v1/status``: state, shape, health, queues, thresholds, audit.

Why here, beside the view model: the API client builds it, and the front-ends and services
that read a live cluster's status (live tuning, the recorder, the TUI) type it, without
importing the API (services cannot). Pure data: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dualpath_cli.faultspec import Fault, FaultError
from dualpath_cli.telemetry.membership import Membership, membership_from_dict
from dualpath_cli.telemetry.storage_health import NodeStorage, storage_from_dicts
from dualpath_cli.telemetry.view import AuditEntry, Thresholds, fields_of

__all__ = ["Status", "status_from_dict"]

@dataclass(frozen=True, slots=True)
class Status:
    """``/api/v1/status``: state, shape, health, queues, thresholds in force, audit."""

    state: str
    pd: str
    model: str
    policy: str
    engines_healthy: int
    engines_total: int
    queue: dict[str, int]
    thresholds: Thresholds
    decisions: int
    ready_s: float | None
    uptime_s: float
    audit: tuple[AuditEntry, ...] = ()
    #: the injected faults in force (a kind this version does not know: in ``extra``)
    faults: tuple[Fault, ...] = ()
    version: str = ""
    #: flat or hierarchical (``sub_schedulers``), ``nodes_per_group``; empty from an older API
    scheduling: dict[str, Any] = field(default_factory=dict)
    #: what serves beside what was configured (None from an older API)
    membership: Membership | None = None
    #: the one readiness (as ``/readyz``), and why not; None from an older API
    ready: bool | None = None
    not_ready: str = ""
    #: nodes whose store failed reads, held corrupt blocks or refused writes since start
    #: (empty from an older API, or when none did)
    storage: tuple[NodeStorage, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


def status_from_dict(data: dict[str, Any]) -> Status:
    """A :class:`Status` from its JSON form (unknown keys land in ``extra``)."""
    engines = data.get("engines", {})
    known = {f.name for f in dataclasses.fields(Status)} | {"engines"}
    faults, unknown = _faults(data.get("faults") or ())
    extra = {k: v for k, v in data.items() if k not in known}
    if unknown:
        extra["faults"] = unknown
    return Status(
        state=data["state"], pd=data["pd"], model=data["model"], policy=data["policy"],
        engines_healthy=int(engines.get("healthy", 0)),
        engines_total=int(engines.get("total", 0)),
        queue=dict(data.get("queue", {})), thresholds=fields_of(Thresholds, data["thresholds"]),
        decisions=int(data.get("decisions", 0)), ready_s=data.get("ready_s"),
        uptime_s=float(data.get("uptime_s", 0.0)),
        audit=tuple(fields_of(AuditEntry, a) for a in data.get("audit", ())),
        faults=faults, version=str(data.get("version", "")),
        scheduling=dict(data.get("scheduling") or {}),
        membership=membership_from_dict(data.get("membership")),
        ready=None if data.get("ready") is None else bool(data["ready"]),
        not_ready=str(data.get("not_ready") or ""),
        storage=storage_from_dicts(data.get("storage")), extra=extra)


def _faults(data: Sequence[dict[str, Any]]) -> tuple[tuple[Fault, ...], list[dict[str, Any]]]:
    """The listed faults as records, and those of a kind this version does not know."""
    known: list[Fault] = []
    unknown: list[dict[str, Any]] = []
    for item in data:
        try:
            known.append(Fault.from_dict(item))
        except FaultError:
            unknown.append(item)
    return tuple(known), unknown


