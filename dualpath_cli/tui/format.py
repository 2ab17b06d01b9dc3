"""What each screen shows, as plain rows of text: no Textual here, so it is tested fast.

Why apart from the widgets: the cluster screen's 1,152-row refresh must stay under 100 ms,
and the rows (sorted, filtered) are most of that work; keeping them plain tuples of strings
makes them cheap and testable. No judging happens here: an engine's class is core's own
``classify_pe`` (the paper's C1/C2/C3 against alpha and beta), the imbalance figure is core's
``max_over_avg``, the per-layer table and the findings are diagnose's (rules.py, workflows/).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dualpath_cli.core.balance import max_over_avg
from dualpath_cli.core.pe_fetch import PEClass, classify_pe
from dualpath_cli.core.types import EngineSnapshot, Role
from dualpath_cli.diagnose.model import Severity
from dualpath_cli.faultspec import Fault
from dualpath_cli.telemetry.recording import Sample
from dualpath_cli.telemetry.view import NA, ClusterView, Decision, EngineView, NodeView
from dualpath_cli.units import format_bytes, format_duration, format_tokens

__all__ = ["ENGINE_COLUMNS", "CLASS_WORDS", "EngineRow", "engine_rows", "engine_class",
           "node_name", "sparkline", "Quadrant", "nic_quadrants", "layer_rows",
           "decision_rows", "decision_detail", "alert_rows", "status_line", "clock",
           "pct", "QUADRANTS", "GRADE_MARKS", "node_grades", "graded_name"]

#: A part's mark and colour by the worst grade covering it (diagnose's; the mark is shown so
#: the grade is never colour alone, as under NO_COLOR).
GRADE_MARKS: dict[Severity, tuple[str, str]] = {Severity.WARNING: ("!", "bold yellow"),
                                                Severity.CRITICAL: ("!!", "bold red")}


def node_grades(reports: Iterable[Any], faults: Iterable[Fault],
                view: ClusterView | None) -> dict[int, Severity]:
    """Node -> the worst grade covering it (its open findings and its engines', and the
    faults in force on them: diagnose/degraded.py); nodes nothing covers are left out."""
    if view is None:
        return {}
    from dualpath_cli.diagnose.degraded import node_grade, worst_by_subject

    worst = worst_by_subject(reports, faults, view)
    if not worst:
        return {}
    grades = {n.node: node_grade(worst, view, n.node) for n in view.nodes}
    return {node: g for node, g in grades.items() if g in GRADE_MARKS}


def graded_name(name: str, grade: Severity | None, width: int | None = None) -> str:
    """``D1!``: a node's name with its grade's mark (unchanged when nothing covers it); in
    a column of ``width`` a long name is cut, never its mark (``gpu…!!``, not ``gpu-``)."""
    mark = GRADE_MARKS.get(grade, ("", ""))[0] if grade is not None else ""
    if width is not None and len(name) + len(mark) > width:
        name = name[:max(1, width - len(mark) - 1)] + "…"
    return name + mark

#: The class word shown beside an engine (the paper's C1/C2/C3), so class is never colour alone.
CLASS_WORDS = {PEClass.OVERLOADED: "overloaded", PEClass.SHORT_READ: "short-rq",
               PEClass.LONG_READ: "long-rq"}
#: (key, header, width) of the cluster screen's engine table.
ENGINE_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("id", "id", 4), ("node", "node", 4), ("class", "class", 10), ("tokens", "tok/beta", 10),
    ("read_q", "rq/alpha", 10), ("snic", "sNIC", 4), ("cnic", "cNIC", 4),
    ("hbm", "HBM", 7), ("frag", "frag", 4), ("seq", "seq", 3), ("role", "role", 7),
    ("state", "state", 8))
_NODE_WIDTH = next(w for k, _, w in ENGINE_COLUMNS if k == "node")
_SPARK_UNICODE = "▁▂▃▄▅▆▇█"
_SPARK_ASCII = "_.-=+*#@"
_SHADE_ASCII = " .:-=+*#%@"


def pct(value: float | None) -> str:
    """``42%`` or ``n/a``."""
    return NA if value is None else f"{value * 100:.0f}%"


def clock(at: float) -> str:
    """``HH:MM:SS`` UTC of a wall-clock time."""
    return time.strftime("%H:%M:%S", time.gmtime(at))


def node_name(role: str | None, node: int | None, name: str | None = None) -> str:
    """The operator's name (``--node D0``, from the view) when known, else ``P0`` / ``D1``
    (how the operator stories and diagnose name a launch's nodes)."""
    if name:
        return name
    if node is None:
        return "?"
    return f"{'P' if role == 'prefill' else 'D'}{node}"


def engine_class(e: EngineView, alpha: int, beta: int) -> str:
    """The engine's class word now: core's ``classify_pe`` (``down`` when not ready)."""
    if e.state != "ready":
        return "down" if e.state == "dead" else e.state
    snap = EngineSnapshot(e.engine_id, e.node, e.group, Role(e.role), e.seq, e.tokens,
                          e.read_queue_tokens or 0, 0, True)
    return CLASS_WORDS[classify_pe(snap, alpha, beta)]


@dataclass(frozen=True, slots=True)
class EngineRow:
    """One engine table row: its id, the cells, the class word (the row's style) and the
    values it sorts by; ``node_style``: its node's cell colour by the worst grade covering
    the node (GRADE_MARKS; empty when none)."""

    engine_id: int
    cells: tuple[str, ...]
    cls: str
    sort: tuple[Any, ...]
    node_style: str = ""


def _ratio(value: int | None, limit: int) -> str:
    if value is None:
        return NA
    share = f"{value / limit * 100:.0f}%" if limit > 0 else "-"
    return f"{format_tokens(value)} {share}"


def engine_rows(view: ClusterView, text: str = "", sort: str = "id",
                reverse: bool = False,
                grades: Mapping[int, Severity] | None = None) -> list[EngineRow]:
    """The engine table: filtered by ``text`` (any cell contains it, case-insensitive),
    sorted by column ``sort``; an engine's node is marked by ``grades`` (node_grades)."""
    th = view.scheduler.thresholds
    alpha, beta = th.alpha_tokens, th.beta_tokens
    nodes = {n.node: n for n in view.nodes}
    needle = text.strip().lower()
    rows = []
    for e in view.engines:
        n = nodes.get(e.node)
        snic = n.snic_utilization if n else None
        cnic = n.cnic_utilization if n else None
        cls = engine_class(e, alpha, beta)
        cells = (str(e.engine_id),
                 graded_name(node_name(e.role, e.node, e.node_name),
                             (grades or {}).get(e.node), _NODE_WIDTH), cls,
                 _ratio(e.tokens, beta), _ratio(e.read_queue_tokens, alpha), pct(snic),
                 pct(cnic), NA if e.hbm_used_bytes is None else format_bytes(e.hbm_used_bytes),
                 NA if e.hbm_fragmentation is None else f"{e.hbm_fragmentation:.2f}",
                 str(e.seq), e.role, e.state)
        if needle and not any(needle in c.lower() for c in cells):
            continue
        sort_vals = (e.engine_id, (e.role, e.node), cls, e.tokens,
                     _num(e.read_queue_tokens), _num(snic), _num(cnic),
                     _num(e.hbm_used_bytes), _num(e.hbm_fragmentation), e.seq, e.role,
                     e.state)
        grade = (grades or {}).get(e.node)
        rows.append(EngineRow(e.engine_id, cells, cls, sort_vals,
                              GRADE_MARKS[grade][1] if grade in GRADE_MARKS else ""))
    keys = [k for k, _, _ in ENGINE_COLUMNS]
    col = keys.index(sort) if sort in keys else 0
    rows.sort(key=lambda r: (r.sort[col], r.engine_id), reverse=reverse)
    return rows


def _num(value: float | None) -> float:
    return -math.inf if value is None else float(value)


def sparkline(values: Sequence[float | None], width: int, ascii_only: bool = False,
              top: float | None = None) -> str:
    """The last ``width`` values as bars scaled to ``top`` (default: their max; 0 at the
    bottom); a blank for not available."""
    chars = _SPARK_ASCII if ascii_only else _SPARK_UNICODE
    tail = list(values)[-width:]
    known = [v for v in tail if v is not None]
    hi = top if top is not None else (max(known) if known else 0.0)
    out = []
    for v in tail:
        if v is None:
            out.append(" ")
        elif hi <= 0:
            out.append(chars[0])
        else:
            out.append(chars[max(0, min(len(chars) - 1, int(v / hi * (len(chars) - 1) + 0.5)))])
    return "".join(out).rjust(width)


#: The NIC screen's quadrants: (role, NIC attribute, title).
QUADRANTS: tuple[tuple[str, str, str], ...] = (
    ("prefill", "snic_utilization", "PE storage NIC"),
    ("prefill", "cnic_utilization", "PE compute NIC"),
    ("decode", "snic_utilization", "DE storage NIC"),
    ("decode", "cnic_utilization", "DE compute NIC"))


@dataclass(frozen=True, slots=True)
class Quadrant:
    """One role's NIC over the window: mean utilisation per sample, Max/Avg now, nodes."""

    title: str
    mean: tuple[float | None, ...]
    max_avg: float | None
    nodes: tuple[tuple[str, float | None, tuple[float | None, ...]], ...]
    #: per node (as ``nodes``), the worst grade covering it (OK: nothing does)
    grades: tuple[Severity, ...] = ()


def nic_quadrants(history: Sequence[Sample],
                  grades: Mapping[int, Severity] | None = None) -> list[Quadrant]:
    """The four quadrants (PE/DE x storage/compute NIC) over ``history``; ``grades``:
    node -> the worst grade covering it (node_grades)."""
    out = []
    for role, attr, title in QUADRANTS:
        series: dict[int, list[float | None]] = {}
        means: list[float | None] = []
        for s in history:
            vals = []
            for n in s.view.nodes:
                if n.role != role:
                    continue
                v = getattr(n, attr)
                series.setdefault(n.node, []).append(v)
                if v is not None:
                    vals.append(float(v))
            means.append(sum(vals) / len(vals) if vals else None)
        last: list[NodeView] = [n for n in history[-1].view.nodes if n.role == role] \
            if history else []
        now = [float(v) for v in (getattr(n, attr) for n in last) if v is not None]
        ratio = max_over_avg(now) if now else math.nan
        nodes = tuple((node_name(n.role, n.node, n.name), getattr(n, attr),
                       tuple(series.get(n.node, ()))) for n in last)
        out.append(Quadrant(title, tuple(means), None if math.isnan(ratio) else ratio, nodes,
                            tuple((grades or {}).get(n.node, Severity.OK) for n in last)))
    return out


def shade(share: float | None, ascii_only: bool) -> str:
    """A heat cell's text: the share in percent, with a density character in ASCII mode."""
    if share is None:
        return NA
    text = f"{share * 100:3.0f}%"
    if ascii_only:
        text += " " + _SHADE_ASCII[min(len(_SHADE_ASCII) - 1, int(share * len(_SHADE_ASCII)))]
    return text


def layer_rows(history: Sequence[Sample]) -> list[dict[str, Any]]:
    """Per layer over the window (diagnose's ``layer_table``: tiers and slack)."""
    if not history:
        return []
    from dualpath_cli.diagnose.model import Evidence
    from dualpath_cli.diagnose.workflows.cache_hit import layer_table

    return layer_table(Evidence(history))


def _side(d: Decision) -> str:
    return {"pe": "PE", "de": "DE", "split": "split"}.get(d.side, d.side)


def decision_rows(decisions: Sequence[Decision], at: float | None,
                  limit: int = 200) -> list[tuple[int, tuple[str, ...]]]:
    """Newest first: seq, age (against the view's time), request, agent/turn, PE, DE,
    read side, prompt and cached tokens, tokens read from storage (PE + DE side), classes."""
    out: list[tuple[int, tuple[str, ...]]] = []
    for d in list(decisions)[-limit:][::-1]:
        age = NA if at is None else format_duration(max(0.0, at - d.at))
        out.append((d.seq, (str(d.seq), age, str(d.rid), f"{d.agent}/{d.turn}", str(d.pe),
                            str(d.de), _side(d), format_tokens(d.length),
                            format_tokens(d.cached), format_tokens(d.pe_tokens + d.de_tokens),
                            d.pe_class or NA, d.de_class or NA)))
    return out


#: Headers of the requests screen (matching :func:`decision_rows`).
DECISION_COLUMNS = ("seq", "age", "req", "agent/turn", "PE", "DE", "read", "prompt",
                    "cached", "read tok", "PE cls", "DE cls")
__all__ += ["DECISION_COLUMNS", "shade"]


def decision_detail(d: Decision) -> str:
    """The decision-log entry that placed a turn, and why (its inputs), for people."""
    lines = [f"decision #{d.seq} at {clock(d.at)} UTC: request {d.rid} (agent {d.agent} "
             f"turn {d.turn}, attempt {d.attempt})",
             f"  prompt {format_tokens(d.length)} tokens, {format_tokens(d.cached)} cached; "
             f"PE {d.pe} reads {format_tokens(d.pe_tokens)}, DE {d.de} (group {d.de_group}) "
             f"reads {format_tokens(d.de_tokens)}",
             f"  read side {_side(d)}: PE read queue {format_tokens(d.pe_read_q)}, DE read "
             f"queue {format_tokens(d.de_read_q)}",
             f"  classes: PE {d.pe_class or NA}, DE {d.de_class or NA}"
             + (f", z {d.z:.2f}" if d.z is not None else "")]
    if d.inputs:
        lines.append("  inputs:")
        text = json.dumps(d.inputs, indent=2, sort_keys=True, default=str)
        lines += ["    " + ln for ln in text.splitlines()]
    return "\n".join(lines)


def alert_rows(reports: Sequence[Any], show_ok: bool = False
               ) -> list[tuple[str, str, str, str]]:
    """(severity, workflow, title, action) of the findings, worst first."""
    findings = [f for r in reports for f in r.findings]
    findings.sort(key=lambda f: -int(f.severity))
    return [(f.severity.name, f.workflow, f.title, f.action or "")
            for f in findings if show_ok or int(f.severity) in (1, 2)]


def alert_counts(reports: Sequence[Any]) -> dict[str, int]:
    """Findings by severity name."""
    out: dict[str, int] = {}
    for r in reports:
        for f in r.findings:
            out[f.severity.name] = out.get(f.severity.name, 0) + 1
    return out


__all__ += ["alert_counts"]


def status_line(view: ClusterView | None, source: str, paused: bool, interval_s: float,
                extra: str = "", screen: str = "") -> str:
    """The top line: screen, shape, state, time, alerts, thresholds, refresh, queues
    (the most needed first: a narrow terminal cuts the end)."""
    name = screen or "dualpath top"
    if view is None:
        return f"{name}  waiting for {source}" + (f" | {extra}" if extra else "")
    th = view.scheduler.thresholds
    parts = [f"{name}  {view.pd} {view.state} {clock(view.at)} UTC"]
    if paused:
        parts.append("PAUSED")
    if extra:
        parts.append(extra)
    parts.append(f"alpha {format_tokens(th.alpha_tokens)} beta {format_tokens(th.beta_tokens)} "
                 f"quota {format_duration(th.quota_s)}")
    if not paused:
        parts.append(f"every {format_duration(interval_s)}")
    parts.append(f"fifo {view.scheduler.fifo_length} in flight {view.scheduler.in_flight}")
    return " | ".join(parts)


def fmt_audit(entry: Any) -> str:
    """One audit line: ``#3 12:00:01 tok-ab12cd34 scheduler alpha 2000 -> 1000``."""
    keys = sorted(set(entry.old) | set(entry.new))
    change = ", ".join(f"{k} {entry.old.get(k, NA)} -> {entry.new.get(k, NA)}" for k in keys)
    return f"#{entry.seq} {clock(entry.at)} {entry.token_id} {entry.action}: {change}"


__all__ += ["fmt_audit"]
