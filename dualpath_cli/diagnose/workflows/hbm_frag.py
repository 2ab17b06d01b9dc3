"""HBM fragmentation: engines whose free KV pages are scattered (the seed's monitor command).

A pure function over :class:`~dualpath_cli.diagnose.model.Evidence` (diagnose/rules.py
runs it); thresholds are diagnose/thresholds.py's.
"""

from __future__ import annotations

from typing import Any

from dualpath_cli.diagnose.grading import CRITICAL, OK, no_samples, tok_text, values_of
from dualpath_cli.diagnose.model import Evidence, Finding, engine_name
from dualpath_cli.diagnose.verdict import RULES, judge

__all__ = ["hbm_frag"]


def hbm_frag(ev: Evidence) -> list[Finding]:
    """Fragmentation score per engine; its largest free run against the largest recent
    request placed on it."""
    wf = "hbm-frag"
    if not ev.samples:
        return [no_samples(wf)]
    frag = ev.engine_series("hbm_fragmentation")
    need: dict[int, int] = {}
    free_tok: dict[int, int] = {}
    for d in ev.decisions:
        for eid in (d.pe, d.de):
            need[eid] = max(need.get(eid, 0), d.length - d.cached if eid == d.pe else d.length)
        for rec in [*d.inputs.get("pe_engines", ()), d.inputs.get("de_engine") or {}]:
            if "id" in rec and rec.get("hbm_free") is not None:
                free_tok[int(rec["id"])] = int(rec["hbm_free"])
    out = []
    worst = 0.0
    rule = RULES["hbm-frag"]
    for eid, series in sorted(frag.items()):
        vals = values_of(series)
        last = vals[-1] if vals else 0.0  # the pool as it is now: a compaction mends it at once
        v = judge(rule, last, len(vals), ev.previous, f"engine {eid}",
                  shown=f"fragmentation {last:.2f}")
        if v is None:
            continue
        worst = max(worst, last)
        if not v.severity:
            continue
        e = ev.engines[eid]
        sev, why = v.severity, v.why
        largest = None
        if eid in free_tok:
            largest = int((1.0 - last) * free_tok[eid])
        ev_d: dict[str, Any] = {"engine": eid, "fragmentation": round(last, 3),
                                "mean_fragmentation": round(sum(vals) / len(vals), 3),
                                "largest_free_blocks": e.hbm_largest_free_blocks,
                                "largest_free_tokens": largest, "next_need_tokens":
                                need.get(eid)}
        extra = ""
        if largest is not None and eid in need:
            extra = (f"; largest free run ~{tok_text(largest)} tok vs "
                     f"{tok_text(need[eid])} tok needed")
            if largest < need[eid]:
                sev = CRITICAL
                extra += " (does not fit)"
                why += (f"; CRITICAL: the largest free run (~{largest} tok) is smaller than "
                        f"the largest request placed on it ({need[eid]} tok)")
        out.append(Finding(
            wf, sev, f"{engine_name(e)} HBM fragmentation {last:.2f}{extra}",
            subject=f"engine {eid}", evidence=ev_d,
            cause="KV blocks freed out of order left the pool in small runs",
            action=f"dualpath diagnose hbm-frag --fix   (compacts engine {eid}'s HBM)",
            rule=rule.name, why=why))
    if not out:
        out.append(Finding(wf, OK, f"HBM fragmentation at most {worst:.2f} on "
                           f"{len(frag)} engines", evidence={"max_fragmentation": worst}))
    return out
