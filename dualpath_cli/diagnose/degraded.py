"""Which parts run degraded: the injected faults in force and the open diagnose findings.

Why one place: ``dualpath-monitor --by-node`` marks a degraded node and ``dualpath top``
draws a node in the colour of its worst open finding, live and in replay; both must agree
on what covers a part. A fault in force covers its node or engine (a WARNING: the part is
degraded on purpose); a finding covers the part its ``subject`` names (``node D1``,
``engine 3``) at its own grade. In a replay the faults in force are read off the audit
trail (each ``faults`` entry lists all those in force after it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dualpath_cli.diagnose.model import Severity, node_name
from dualpath_cli.faultspec import Fault, FaultError
from dualpath_cli.telemetry.view import AuditEntry, ClusterView

__all__ = ["faults_at", "fault_subjects", "worst_by_subject", "node_grade", "FAULT_GRADE"]

#: The grade a fault in force gives the part it covers: degraded, not down.
FAULT_GRADE = Severity.WARNING


def faults_at(audit: Sequence[AuditEntry] | None, at: float) -> tuple[Fault, ...]:
    """The faults in force at ``at`` by the audit trail (its last ``faults`` entry by then);
    none when the trail is unknown or has no such entry."""
    last: AuditEntry | None = None
    for entry in audit or ():
        if entry.action == "faults" and entry.at <= at:
            last = entry
    out: list[Fault] = []
    for d in (last.new.get("faults", []) if last is not None else []):
        try:
            out.append(Fault.from_dict(d))
        except FaultError:  # a kind this version does not know: not drawn
            continue
    return tuple(out)


def fault_subjects(fault: Fault, view: ClusterView | None) -> str:
    """The subject a fault covers, as findings name it (``node D1``, ``engine 3``)."""
    key, value = fault.target
    if key == "engine":
        return f"engine {value}"
    roles = {n.node: n.role for n in view.nodes} if view is not None else {}
    return f"node {node_name(value, roles.get(value))}"


def worst_by_subject(reports: Iterable[Any], faults: Iterable[Fault],
                     view: ClusterView | None) -> dict[str, Severity]:
    """Subject -> the worst grade covering it: open findings (WARNING or CRITICAL; OK and
    UNKNOWN say nothing about a part) and faults in force."""
    worst: dict[str, Severity] = {}
    for report in reports:
        for f in report.findings:
            if f.subject and f.severity in (Severity.WARNING, Severity.CRITICAL):
                worst[f.subject] = max(worst.get(f.subject, Severity.OK), f.severity)
    for fault in faults:
        subject = fault_subjects(fault, view)
        worst[subject] = max(worst.get(subject, Severity.OK), FAULT_GRADE)
    return worst


def node_grade(worst: Mapping[str, Severity], view: ClusterView, node: int) -> Severity:
    """The worst grade covering ``node``: its own subject and its engines'."""
    roles = {n.node: n.role for n in view.nodes}
    subjects = [f"node {node_name(node, roles.get(node))}"]
    subjects += [f"engine {e.engine_id}" for e in view.engines if e.node == node]
    return max((worst.get(s, Severity.OK) for s in subjects), default=Severity.OK)
