"""Fabric: engines whose compute-fabric link loses the KV of the turns it carries.

Why its own workflow: a lost KV message costs no turn (the scheduler runs the turn again,
``dualpath_scheduler_requeued_turns_total{reason="kv_lost"}``), so nothing else shows it but
latency; the scheduler counts each such turn against the engine whose link lost it (the
view's ``kv_lost_turns``: its own link down, the peer that did not take a message, the PE
whose rows a DE found missing). A pure function over
:class:`~dualpath_cli.diagnose.model.Evidence`; the rule is ``kv-lost`` (diagnose/verdict.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from dualpath_cli.diagnose.grading import OK, no_samples
from dualpath_cli.diagnose.model import Evidence, Finding, engine_name
from dualpath_cli.diagnose.verdict import RULES, judge, not_enough

__all__ = ["fabric", "lost_in_window"]


def lost_in_window(series: Sequence[int | None]) -> int:
    """Turns counted in the window from a cumulative series (an engine that restarted
    counts from zero again: a drop is a reset, not a negative count)."""
    vals = [int(v) for v in series if v is not None]
    return sum(b - a if b >= a else b for a, b in zip(vals, vals[1:], strict=False))


def fabric(ev: Evidence) -> list[Finding]:
    """WARNING per engine whose link lost the KV of at least ``KV_LOST_WARN`` turns in the
    window (rule ``kv-lost``); below ``KV_LOST_MIN_TURNS`` not enough evidence."""
    wf = "fabric"
    if not ev.samples:
        return [no_samples(wf)]
    rule = RULES["kv-lost"]
    series = ev.engine_series("kv_lost_turns")
    out: list[Finding] = []
    quiet = 0
    for eid, s in sorted(series.items()):
        n = lost_in_window(s)
        if n == 0:
            quiet += 1
            continue
        e = ev.engines[eid]
        subject = f"engine {eid}"
        v = judge(rule, n, n, ev.previous, subject, shown=f"{n} turns")
        if v is None:
            out.append(not_enough(rule, n, f"{engine_name(e)} lost the KV of {n} turns",
                                  subject))
            continue
        out.append(Finding(
            wf, v.severity, f"{engine_name(e)} lost the KV of {n} turns on its fabric link "
            f"in {ev.window_s:.0f} s (each run again)", subject=subject,
            evidence={"engine": eid, "node": e.node_name, "kv_lost_turns": n,
                      "samples": len(s)},
            cause="its compute-fabric link drops KV messages (link down, a peer that "
                  "resets it); every turn it carries is run again, later",
            action=f"check engine {eid}'s compute NIC and its links to its peers "
                   "(dualpath faults list shows an injected fabric_drop); drain the node "
                   "if it keeps losing turns", rule=rule.name, why=v.why))
    if not any(f.severity for f in out):
        out.append(Finding(wf, OK, f"no turn's KV lost on the fabric ({quiet} of "
                           f"{len(series)} engines lost none)",
                           evidence={"engines": len(series)}))
    return out
