"""The drill's scorecard: what each row expects, what it saw, and whether it passed.

Why apart from the runner (services/drill.py): the verdict of a row is the contract of the
whole operator surface, so it is pure data and pure functions (no I/O, no clock), tested in
the quick tier. A row passes only when every promise held: status, diagnose (the right
workflow, subject and grade) and the metrics all reported the fault within the row's
deadline, the offered fix (if any) was applied and helped, the fault cleared back to OK, no
turn was lost and every token equals the reference run's. A skipped row (the fault cannot be
made here) says why and does not pass: the drill proves the surface, it does not excuse it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["GRADES", "Expect", "RowResult", "MetricSample", "parse_metrics", "metric_values",
           "matching_findings", "rank", "worst_grade", "row_passed", "scorecard", "exit_code",
           "EXIT_PASSED", "EXIT_FAILED"]

#: Grades in the order diagnose ranks them (its exit codes 0..3).
GRADES = ("OK", "WARNING", "CRITICAL", "UNKNOWN")
#: ``dualpath drill`` exits 0 when every row passed, 2 when any failed or was skipped (and 3,
#: like every check, when it could not run at all).
EXIT_PASSED = 0
EXIT_FAILED = 2

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class Expect:
    """What the operator surface must say about one fault.

    Args:
        workflow: the diagnose workflow that must find it (``None``: any workflow).
        subjects: the subjects a right finding may name (``node D1``, ``engine 1``); a
            subject ending in a space (``block ``) matches any subject it starts.
        grade: the grade that finding must have (CRITICAL for what stops service, WARNING
            for what degrades it).
        deadline_s: from the injection to the last of status, diagnose and metrics.
        words: where given, a right finding's title or cause says one of them (a corrupt
            block must be found corrupt, not merely hot).
    """

    workflow: str | None
    subjects: tuple[str, ...]
    grade: str
    deadline_s: float
    words: tuple[str, ...] = ()

    def subject_matches(self, subject: str | None) -> bool:
        """Whether a finding about ``subject`` is about the faulted part."""
        if not subject:
            return False
        return any(subject == s or (s.endswith(" ") and subject.startswith(s))
                   for s in self.subjects)


@dataclass
class RowResult:
    """One row of the scorecard (one try of one fault)."""

    fault: str
    target: str = ""
    want: str = ""
    deadline_s: float = 0.0
    skipped: str = ""  # why the fault could not be made here ("": it ran)
    error: str = ""  # what went wrong running it ("": nothing)
    status_s: float | None = None  # injection -> status reported it (None: never)
    diagnose_s: float | None = None
    metrics_s: float | None = None
    grade: str = ""  # the worst grade the right findings reached within the deadline
    workflow: str = ""
    subject: str = ""
    subject_right: bool = False
    finding: str = ""  # the matching finding's title (what diagnose said)
    fix: str = ""  # the fix applied ("": the finding offered none the drill can apply)
    fix_helped: bool | None = None  # None: no fix applied
    cleared: bool = False
    turns: int = 0
    turns_lost: int = 0
    tokens_identical: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def detected_s(self) -> float | None:
        """When the last of status, diagnose and the metrics reported it (None: one never)."""
        parts = (self.status_s, self.diagnose_s, self.metrics_s)
        return None if any(p is None for p in parts) else max(p for p in parts if p is not None)

    @property
    def passed(self) -> bool:
        """Every promise held (:func:`row_passed`)."""
        return row_passed(self)

    def to_dict(self) -> dict[str, Any]:
        """The row in ``--json``: every field, ``detected_s`` and ``passed``."""
        d = asdict(self)
        for key in ("status_s", "diagnose_s", "metrics_s"):
            if d[key] is not None:
                d[key] = round(d[key], 3)
        det = self.detected_s
        d["detected_s"] = None if det is None else round(det, 3)
        d["passed"] = self.passed
        return d


def row_passed(r: RowResult) -> bool:
    """A row passes when it ran without error, was detected by all three surfaces within its
    deadline at the wanted grade on the right subject, its fix (if applied) helped, it
    cleared, and no turn was lost or changed."""
    det = r.detected_s
    return (not r.skipped and not r.error and det is not None and det <= r.deadline_s
            and r.grade == r.want and r.subject_right and r.fix_helped is not False
            and r.cleared and r.turns_lost == 0 and r.tokens_identical and r.turns > 0)


@dataclass(frozen=True, slots=True)
class MetricSample:
    """One sample line of a Prometheus exposition."""

    name: str
    labels: Mapping[str, str]
    value: float


def parse_metrics(text: str) -> list[MetricSample]:
    """Every ``dualpath_*`` sample of an exposition (comments and other families skipped)."""
    out: list[MetricSample] = []
    for line in (text or "").splitlines():
        if not line.startswith("dualpath_"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append(MetricSample(m.group(1), dict(_LABEL.findall(m.group(2) or "")), value))
    return out


def metric_values(samples: Iterable[MetricSample], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when none)."""
    return sum(s.value for s in samples if s.name == name
               and all(s.labels.get(k) == v for k, v in labels.items()))


def matching_findings(reports: Sequence[Mapping[str, Any]], expect: Expect
                      ) -> list[Mapping[str, Any]]:
    """The findings (``Report.to_dict()``'s) about the faulted subject, in the expected
    workflow (saying one of the expected words, if any), at WARNING or worse, worst first."""
    out = []
    for rep in reports:
        for f in rep.get("findings", ()):
            if expect.workflow is not None and f.get("workflow") != expect.workflow:
                continue
            if f.get("severity") not in ("WARNING", "CRITICAL"):
                continue
            said = f"{f.get('title') or ''} {f.get('cause') or ''}".lower()
            if expect.words and not any(w in said for w in expect.words):
                continue
            if expect.subject_matches(f.get("subject")):
                out.append(f)
    return sorted(out, key=lambda f: -GRADES.index(str(f.get("severity"))))


def rank(grade: str) -> int:
    """A grade's rank (OK 0 .. UNKNOWN 3; an unknown word ranks as OK)."""
    return GRADES.index(grade) if grade in GRADES else 0


def worst_grade(findings: Iterable[Mapping[str, Any]]) -> str:
    """The worst grade among ``findings`` (OK when none)."""
    ranks = [GRADES.index(str(f.get("severity", "OK"))) for f in findings]
    return GRADES[max(ranks, default=0)]


def _cell(value: float | None) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else (
        f"{value:.1f} s")


def scorecard(rows: Sequence[RowResult]) -> list[dict[str, str]]:
    """The table's cells, one dict per row (for people; ``--json`` has :meth:`to_dict`)."""
    table = []
    for r in rows:
        fix = "-" if not r.fix else (r.fix if r.fix_helped is not False else f"{r.fix} (no help)")
        table.append({
            "fault": f"{r.fault} {r.target}".strip(),
            "detected": "skipped" if r.skipped else _cell(r.detected_s),
            "grade (want)": "-" if r.skipped else f"{r.grade or 'none'} ({r.want})",
            "subject": "-" if r.skipped else (r.subject or "none") + (
                "" if r.subject_right else " (wrong)"),
            "fix": fix,
            "cleared": "-" if r.skipped else ("yes" if r.cleared else "no"),
            "lost": "-" if r.skipped else str(r.turns_lost),
            "tokens": "-" if r.skipped else ("same" if r.tokens_identical else "DIFFER"),
            "passed": "skip" if r.skipped else ("yes" if r.passed else "NO"),
        })
    return table


def exit_code(rows: Sequence[RowResult]) -> int:
    """0 when there are rows and every one passed, else 2."""
    return EXIT_PASSED if rows and all(r.passed for r in rows) else EXIT_FAILED
