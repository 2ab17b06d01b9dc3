"""The previous diagnose verdicts on a cluster, kept between runs for the rules' hysteresis.

Why a file: ``dualpath diagnose`` runs in a fresh process each time (cron, an operator, the
drill), so the grade a rule gave the same subject a window ago is read back from
``diagnose-verdicts.json`` in the state directory (services/statefile.py), one entry per
cluster URL. An entry counts only for the window right after it: when it ended no longer
ago than one window length (at least :data:`REACH_MIN_S`) before the new window started;
an older one says nothing about the fault now. Beside the grades, each node's store-read
counts taken in the window (diagnose/read_history.py: the blocks' read latency under
``reads``, the store's service time under ``service``) are kept for
``STORE_LATENCY_LOOKBACK_S``: rule store-latency counts a node's last reads back to one of
them when a window holds too few. Diagnosing a recording uses none and keeps none: its
verdict is a function of the file alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from dualpath_cli.atomicio import atomic_write_text
from dualpath_cli.diagnose.model import Report, Severity
from dualpath_cli.diagnose.read_history import Snapshot, merged, snapshots
from dualpath_cli.diagnose.thresholds import STORE_LATENCY_LOOKBACK_S
from dualpath_cli.diagnose.verdict import RULES, previous_grades
from dualpath_cli.diagnose.workflows.store_latency import service_of
from dualpath_cli.services.statefile import state_dir

__all__ = ["load_previous", "load_read_history", "load_service_history", "save_verdicts",
           "REACH_MIN_S", "FILE_NAME"]

FILE_NAME = "diagnose-verdicts.json"
#: A previous verdict counts when it ended at most one window, and at least this many
#: seconds, before the new window started.
REACH_MIN_S = 60.0
#: Clusters kept in the file (the most recent).
_KEEP = 16


def _read() -> dict[str, Any]:
    try:
        data = json.loads((state_dir() / FILE_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load_previous(target: str, start: float, window_s: float) -> dict[str, Severity] | None:
    """The previous verdicts on ``target`` if they ended close enough before ``start``
    (``None``: none in reach: the rules grade by their thresholds alone)."""
    entry = _read().get(target)
    if not isinstance(entry, dict):
        return None
    end = entry.get("end")
    grades = entry.get("grades")
    if not isinstance(end, int | float) or not isinstance(grades, dict):
        return None
    if not (start - max(window_s, REACH_MIN_S) <= end <= start + window_s):
        return None
    return {str(k): Severity[v] for k, v in grades.items()
            if isinstance(v, str) and v in Severity.__members__}


def _history(entry: Any, key: str = "reads") -> dict[int, list[Snapshot]]:
    """An entry's kept store-read counts by node under ``key`` (``reads``: read latency,
    ``service``: service time; malformed ones dropped)."""
    raw = entry.get(key) if isinstance(entry, dict) else None
    out: dict[int, list[Snapshot]] = {}
    for node, snaps in (raw.items() if isinstance(raw, dict) else ()):
        try:
            out[int(node)] = [(float(at), float(t), int(c)) for at, t, c in snaps]
        except (TypeError, ValueError):
            continue
    return out


def load_read_history(target: str) -> dict[int, list[Snapshot]]:
    """Each node's store-read counts the earlier runs on ``target`` kept (the rule picks
    those in its reach)."""
    return _history(_read().get(target))


def load_service_history(target: str) -> dict[int, list[Snapshot]]:
    """Each node's store service-time counts the earlier runs on ``target`` kept."""
    return _history(_read().get(target), "service")


def save_verdicts(target: str, end: float, reports: list[Report],
                  samples: Sequence[Any] = ()) -> None:
    """Keep ``reports``' graded verdicts on ``target``: those of the workflows run replace
    theirs, the other workflows' kept ones stay; and the store-read counts of the window's
    ``samples`` beside those kept, for ``STORE_LATENCY_LOOKBACK_S`` (a file that cannot be
    written is skipped: hysteresis and lookback are a help, not a duty)."""
    grades: Mapping[str, Severity] = previous_grades(
        [f for r in reports for f in r.findings])
    ran = {r.workflow for r in reports}
    data = _read()
    old = data.get(target)
    old = old if isinstance(old, dict) else {}
    kept = {k: v for k, v in (old.get("grades") or {}).items()
            if k.split("|", 1)[0] in RULES
            and RULES[k.split("|", 1)[0]].workflow not in ran}
    reads = merged(_history(old), snapshots(samples), end, STORE_LATENCY_LOOKBACK_S)
    service = merged(_history(old, "service"), snapshots(samples, service_of), end,
                     STORE_LATENCY_LOOKBACK_S)
    data[target] = {"end": end, "grades": {**kept, **{k: v.name for k, v in grades.items()}},
                    "reads": {str(n): [list(s) for s in snaps] for n, snaps in reads.items()},
                    "service": {str(n): [list(s) for s in snaps]
                                for n, snaps in service.items()}}
    if len(data) > _KEEP:
        newest = sorted(data, key=lambda k: -float((data[k] or {}).get("end", 0) or 0))
        data = {k: data[k] for k in newest[:_KEEP]}
    try:
        atomic_write_text(state_dir() / FILE_NAME, json.dumps(data, indent=1))
    except OSError:
        return
