"""6.1 Performance drop with storage-NIC imbalance: the storage NICs' balance, bandwidth,
errors and a recent change of alpha, decisions that misread a PE's class, and a slow store
behind a node (rule store-latency, diagnose/workflows/store_latency.py).

A pure function over :class:`~dualpath_cli.diagnose.model.Evidence` (diagnose/rules.py
runs it); thresholds are diagnose/thresholds.py's.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from dualpath_cli.diagnose.grading import (
    OK,
    WARNING,
    mean_of,
    no_samples,
    pct,
    role_nodes,
    share_of,
    tok_text,
    values_of,
)
from dualpath_cli.diagnose.model import Change, Evidence, Finding, engine_name, node_name
from dualpath_cli.diagnose.thresholds import (
    CHANGE_MIN_READS,
    CHANGE_REACH_MIN_S,
    SNIC_BUSY_MIN,
    SNIC_SATURATED,
)
from dualpath_cli.diagnose.verdict import RULES, Verdict, judge, not_enough
from dualpath_cli.diagnose.workflows.store_latency import store_latency
from dualpath_cli.telemetry.view import Decision

__all__ = ["snic_imbalance", "change_reach_s"]


def snic_imbalance(ev: Evidence) -> list[Finding]:
    """Storage NICs per node and role: each node's link rate against the fastest node's,
    Max/Avg, saturation, read queues over alpha that decisions ignored, classes the inputs
    contradict, NIC errors. Each is a graded rule (diagnose/verdict.py)."""
    wf = "snic-imbalance"
    if not ev.samples:
        return [no_samples(wf)]
    out: list[Finding] = []
    util = ev.node_series("snic_utilization")
    bw = ev.node_series("snic_bandwidth_bytes_per_s")
    rq = ev.node_series("read_queue_tokens")
    alpha = ev.alpha_series
    all_bw = {n: m for n, m in ((n, mean_of(s)) for n, s in bw.items()) if m}
    roles = sorted(role_nodes(ev).items())
    for role, ids in roles:
        out.extend(_balance(ev, role, ids, util))
    out.extend(_links(ev, bw, all_bw, alpha))
    out.extend(store_latency(ev))
    for role, ids in roles:
        for n in ids:
            out.extend(_saturated(ev, n, role, util.get(n, [])))
            out.extend(_read_queue(ev, n, role, rq.get(n, []), alpha))
    out.extend(_misclassified(ev, wf))
    out.extend(_nic_errors(ev, wf))
    if not any(f.severity for f in out):
        shaped = any(v is not None for s in util.values() for v in s)
        out.append(Finding(wf, OK, "storage NICs: no imbalance, no degraded link, read queues "
                           "within alpha" + ("" if shaped else
                                             " (utilisation not available: unshaped NICs)"),
                           evidence={"nodes": len(ev.nodes)}))
    return out


def _links(ev: Evidence, bw: dict[int, list[Any]], all_bw: dict[int, float],
           alpha: Sequence[int]) -> list[Finding]:
    """Rule snic-link: each node's storage-NIC rate against the fastest node's (the nodes
    share one configured rate: ``hardware.snic_bandwidth``), worst first. The rate is the
    link's (shaped or negotiated) rate, which does not depend on how many reads landed on
    the node, so a steady fault keeps its grade; every degraded node is its own finding."""
    rule = RULES["snic-link"]
    if len(all_bw) < 2:
        return []
    expected = max(all_bw.values())
    out = []
    for n, b in sorted(all_bw.items(), key=lambda nb: nb[1]):
        role = ev.nodes[n].role
        name = _name(ev, n, role)
        subject = f"node {name}"
        frac = b / expected if expected else 1.0
        counted = len(values_of(bw.get(n, ())))
        v = judge(rule, frac, counted, ev.previous, subject, shown=f"{pct(frac)} of expected")
        if v is None:
            if frac < rule.warn:
                out.append(not_enough(rule, counted, f"{subject} storage NIC", subject))
        elif v.severity:
            out.append(_degraded_link(ev, n, role, b, expected, frac, all_bw, alpha, v))
    return out


def _balance(ev: Evidence, role: str, ids: list[int],
             util: dict[int, list[Any]]) -> list[Finding]:
    """Rule snic-balance: the busiest node's mean utilisation over the role's mean."""
    wf, rule = "snic-imbalance", RULES["snic-balance"]
    means = {n: mean_of(util.get(n, ())) for n in ids}
    known = {n: m for n, m in means.items() if m is not None}
    if len(known) < 2:
        return []
    avg = sum(known.values()) / len(known)
    if avg < SNIC_BUSY_MIN:
        return []
    hot = max(known, key=lambda n: known[n])
    ratio = known[hot] / avg
    name = _name(ev, hot, role)
    counted = min(len(values_of(util.get(n, ()))) for n in known)
    v = judge(rule, ratio, counted, ev.previous, f"node {name}", shown=f"Max/Avg {ratio:.2f}")
    if v is None:
        return [not_enough(rule, counted, f"{role} storage NICs Max/Avg", f"node {name}")]
    sev = v.severity
    return [Finding(
        wf, sev, f"{role} storage NICs Max/Avg {ratio:.2f} over "
        f"{ev.window_s:.0f} s (busiest node {name} at {pct(known[hot])})",
        subject=f"node {name}" if sev else None,
        evidence={"role": role, "max_avg": round(ratio, 3), "samples": counted,
                  "utilization": {_name(ev, n, role): round(v, 3) for n, v in known.items()}},
        cause=f"reads pile onto node {name}" if sev else None,
        action=("dualpath-monitor --metric snic_util --by-node --interval 1s"
                if sev else None), rule=rule.name, why=v.why)]


def _saturated(ev: Evidence, n: int, role: str, series: list[Any]) -> list[Finding]:
    """Rule snic-saturated: the share of samples with the node's NIC saturated."""
    rule = RULES["snic-saturated"]
    name = _name(ev, n, role)
    counted = len(values_of(series))
    busy = share_of(series, lambda v: v >= SNIC_SATURATED)
    v = judge(rule, busy, counted, ev.previous, f"node {name}",
              shown=f"{pct(busy)} of samples saturated")
    if v is None or not v.severity:
        return []
    return [Finding(
        "snic-imbalance", v.severity, f"node {name} storage NIC saturated (>= "
        f"{pct(SNIC_SATURATED)}) in {pct(busy)} of samples",
        subject=f"node {name}",
        evidence={"node": name, "mean_utilization": mean_of(series), "samples": counted},
        cause=f"more reads than {name}'s storage NIC can carry",
        action="dualpath tune suggest --window 10m", rule=rule.name, why=v.why)]


def _read_queue(ev: Evidence, n: int, role: str, series: list[Any],
                alpha: Sequence[int]) -> list[Finding]:
    """Rule read-queue: the share of samples with the node's read queue over alpha."""
    rule = RULES["read-queue"]
    name = _name(ev, n, role)
    over = [q > a for q, a in zip(series, alpha, strict=False) if q is not None]
    share = sum(over) / len(over) if over else 0.0
    v = judge(rule, share, len(over), ev.previous, f"node {name}",
              shown=f"{pct(share)} of samples over alpha")
    if v is None or not v.severity:
        return []
    sent = _reads_to_node(ev, n)
    total = len(ev.decisions)
    mean_q = mean_of(series) or 0.0
    return [Finding(
        "snic-imbalance", v.severity, f"node {name} read queue {tok_text(mean_q)} tok over "
        f"alpha {tok_text(alpha[-1])} in {pct(share)} of samples; "
        f"{sent}/{total} reads still sent to {name}",
        subject=f"node {name}",
        evidence={"node": name, "mean_read_queue_tokens": mean_q,
                  "alpha_tokens": alpha[-1], "reads_sent": sent,
                  "decisions": total, "samples": len(over)},
        cause=f"{name} reads slower than it is given work",
        action=f"dualpath tune set alpha={_value_text(ev, 'alpha', max(1, alpha[-1] // 2))}",
        rule=rule.name, why=v.why)]


def _degraded_link(ev: Evidence, n: int, role: str, b: float, med: float, frac: float,
                   all_bw: dict[int, float], alpha: Sequence[int], v: Verdict) -> Finding:
    """A node's storage NIC below the fastest node's, graded by rule snic-link alone (the
    link's rate, not the reads that happened to reach it). Lowering alpha cannot mend the
    link, only steer reads away, so once the node takes no more than its share of the
    cluster's storage bandwidth in reads the finding asks for no further step (the operator
    who applied its ``tune set`` was told to halve alpha again forever); its grade stays.

    After a change of alpha or the read side in reach (:func:`change_reach_s`), the reads
    since it are judged, and the finding says how the node's share of reads moved: before
    the change (over as long before it as has passed since) against after it."""
    name = _name(ev, n, role)
    sent = _reads_to_node(ev, n)
    reads = sum(1 for d in ev.decisions if _is_read(d))
    fair = b / sum(all_bw.values()) if all_bw else 0.0
    evidence: dict[str, Any] = {"node": name, "bandwidth_bytes_per_s": b,
                                "expected_bytes_per_s": med, "fraction": round(frac, 3),
                                "reads_sent": sent, "decisions": reads,
                                "bandwidth_share": round(fair, 3),
                                "samples": len(values_of(ev.node_series(
                                    "snic_bandwidth_bytes_per_s").get(n, ())))}
    moved = _reads_since_change(ev, n)
    if moved is not None:
        evidence.update(moved["evidence"])
    if moved is not None and moved["compared"]:
        sent, reads = moved["after"]  # what the change left is what counts now
    steered = reads > 0 and sent / reads <= fair
    link = f"{_gbs(b)} vs {_gbs(med)}, the fastest node's"
    check = f"check the storage NIC of {name} (ethtool -S, dmesg)"
    sev = v.severity
    steer = (f"{check}; meanwhile steer reads away: dualpath tune set alpha="
             f"{_value_text(ev, 'alpha', max(1, min(alpha) // 2))}")
    kw: dict[str, Any] = {"subject": f"node {name}", "evidence": evidence,
                          "rule": "snic-link", "why": v.why}
    if moved is not None and moved["compared"]:
        (b_sent, b_reads), share = moved["before"], sent / reads
        before = b_sent / b_reads
        trend = (f"down from {pct(before)} to {pct(share)}"
                 if round(share * 100) < round(before * 100) else
                 f"not down ({pct(before)} before, {pct(share)} after)")
        title = (f"node {name} storage NIC still slow; reads to {name} {trend} since "
                 f"{moved['since']}")
        if steered:
            return Finding(
                "snic-imbalance", sev, title, **kw,
                cause=f"a degraded or throttled storage link on {name} (at {pct(frac)} of "
                      f"expected: {link}); reads to it ({sent}/{reads}) are within its "
                      f"{pct(fair)} share of the storage bandwidth", action=check)
        return Finding(
            "snic-imbalance", sev, title, **kw,
            cause=f"a degraded or throttled storage link on {name} (at {pct(frac)} of "
                  f"expected: {link}); reads to it ({sent}/{reads}) still over its "
                  f"{pct(fair)} share of the storage bandwidth", action=steer)
    title = f"node {name} storage NIC at {pct(frac)} of expected ({link})"
    if steered:
        return Finding(
            "snic-imbalance", sev, f"node {name} storage NIC still at {pct(frac)} of expected "
            f"({_gbs(b)} vs {_gbs(med)}); reads to {name} {pct(sent / reads)} ({sent}/"
            f"{reads}), within its {pct(fair)} share of the storage bandwidth", **kw,
            cause=f"a degraded or throttled storage link on {name}; reads already avoid it",
            action=check)
    if reads:
        title += f"; {pct(sent / reads)} of reads ({sent}/{reads}) still sent to {name}"
    return Finding("snic-imbalance", sev, title, **kw,
                   cause=f"a degraded or throttled storage link on {name}", action=steer)


def change_reach_s(window_s: float) -> float:
    """How long before a window's start a change of alpha or the read side still counts:
    one window length, at least :data:`CHANGE_REACH_MIN_S`."""
    return max(window_s, CHANGE_REACH_MIN_S)


def _is_read(d: Decision) -> bool:
    return d.side in ("pe", "de", "split")


def _recent_change(ev: Evidence) -> tuple[Change, list[Decision], list[Decision]] | None:
    """The change of alpha or the read side in reach, with the reads before and after it.

    The latest change with at least :data:`CHANGE_MIN_READS` reads after it (controller
    steps can come every few seconds), else the latest; after: every read from it on;
    before: the reads in as long before it (the window's, and those the cluster logged
    before the window: ``Evidence.earlier``). ``None``: no change in reach.
    """
    start, end = ev.samples[0].at, ev.samples[-1].at
    reach = change_reach_s(ev.window_s)
    near = [c for c in ev.changes if start - reach <= c.at <= end]
    if not near:
        return None
    reads = [d for d in (*ev.earlier, *ev.decisions) if _is_read(d)]
    change = next((c for c in reversed(near)
                   if sum(1 for d in reads if d.at >= c.at) >= CHANGE_MIN_READS), near[-1])
    after = [d for d in reads if d.at >= change.at]
    span = max(end, *(d.at for d in after)) - change.at if after else end - change.at
    before = [d for d in reads if change.at - span <= d.at < change.at]
    return change, before, after


def _value_text(ev: Evidence, what: str, value: Any) -> str:
    """A changed threshold as the operator gave it: alpha in seconds of reading where the
    cluster said how many seconds a token is, else in tokens; the read side by name."""
    if what != "alpha" or isinstance(value, bool) or not isinstance(value, int | float):
        return "?" if value is None else str(value)
    per = ev.alpha_s_per_token or ev.last.scheduler.thresholds.alpha_s_per_token
    if per:
        from dualpath_cli.units import format_duration_rounded

        return format_duration_rounded(value * per)
    return tok_text(value)


def _change_text(ev: Evidence, c: Change) -> str:
    """``alpha 2s -> 1s (audit #17)``."""
    what = "alpha" if c.what == "alpha" else "read side"
    ref = (f"audit #{c.seq}" if c.by == "audit" else
           f"controller step, decision #{c.seq}" if c.by == "controller" else
           f"set by {c.source or 'an unknown source'}, seen in the samples "
           f"{c.at - ev.samples[0].at:+.0f} s into the window")
    return (f"{what} {_value_text(ev, c.what, c.old)} -> {_value_text(ev, c.what, c.new)} "
            f"({ref})")


def _reads_since_change(ev: Evidence, node: int) -> dict[str, Any] | None:
    """Reads to ``node`` before and after the change in reach: ``before``/``after`` as
    (sent to the node, reads), ``compared`` when both sides hold :data:`CHANGE_MIN_READS`
    reads, ``since`` the change in words, ``evidence`` the numbers for ``--json``."""
    found = ev.memo("recent_change", lambda: _recent_change(ev))
    if found is None:
        return None
    change, before, after = found
    b = (_reads_to_node(ev, node, before), len(before))
    a = (_reads_to_node(ev, node, after), len(after))
    compared = b[1] >= CHANGE_MIN_READS and a[1] >= CHANGE_MIN_READS
    return {"before": b, "after": a, "compared": compared, "since": _change_text(ev, change),
            "evidence": {
                "change": change.to_dict(),
                "audit_seq": change.seq if change.by == "audit" else None,
                "reads_before": {"sent": b[0], "reads": b[1]},
                "reads_after": {"sent": a[0], "reads": a[1]},
                "share_before": round(b[0] / b[1], 3) if b[1] else None,
                "share_after": round(a[0] / a[1], 3) if a[1] else None,
                "compared": compared}}


def _gbs(bps: float) -> str:
    from dualpath_cli.units import format_bandwidth

    return format_bandwidth(bps)


def _reads_to_node(ev: Evidence, node: int,
                   decisions: Sequence[Decision] | None = None) -> int:
    """Decisions (the window's, or ``decisions``) whose read side is an engine on ``node``."""
    engines = ev.engines
    count = 0
    for d in ev.decisions if decisions is None else decisions:
        target = d.pe if d.side == "pe" else d.de if d.side == "de" else None
        if d.side == "split":
            if (engines.get(d.pe) and engines[d.pe].node == node) or (
                    engines.get(d.de) and engines[d.de].node == node):
                count += 1
        elif target is not None and target in engines and engines[target].node == node:
            count += 1
    return count


def _misclassified(ev: Evidence, wf: str) -> list[Finding]:
    """PE classes the decision's own inputs, or the node's reported read queue, contradict."""
    per_engine: dict[int, list[int]] = {}
    times = [s.at for s in ev.samples]
    node_q = ev.node_series("read_queue_tokens")
    engines = ev.engines
    for d in ev.decisions:
        if d.pe_class is None:
            continue
        alpha = d.inputs.get("alpha")
        beta = d.inputs.get("beta")
        if alpha is None or beta is None:
            continue
        rec = next((x for x in d.inputs.get("pe_engines", ()) if x.get("id") == d.pe), None)
        expected = None
        if rec is not None:
            tok, rq = rec.get("tok", 0), rec.get("read_q", 0)
            expected = "C1" if tok > beta else "C2" if rq <= alpha else "C3"
        reported = None
        eng = engines.get(d.pe)
        if eng is not None and eng.node in node_q:
            i = bisect.bisect_right(times, d.at) - 1  # the sample at or just before it
            reported = node_q[eng.node][i] if 0 <= i < len(node_q[eng.node]) else None
        bad = (expected is not None and expected != d.pe_class) or (
            d.pe_class == "C2" and reported is not None and reported > alpha)
        per_engine.setdefault(d.pe, [0, 0])
        per_engine[d.pe][0] += 1
        per_engine[d.pe][1] += int(bad)
    out = []
    rule = RULES["misclassified"]
    for eid, (total, bad) in sorted(per_engine.items()):
        if eid not in engines:
            continue
        # None: too few decisions of this PE to call a share of them
        v = judge(rule, bad / total, total, ev.previous, f"engine {eid}",
                  shown=f"{pct(bad / total)} contradicted")
        if v is not None and v.severity:
            e = engines[eid]
            out.append(Finding(
                wf, v.severity, f"{engine_name(e)}: {bad} of {total} decisions classed it "
                "against what its read queue and tokens say (alpha/beta)",
                subject=f"engine {eid}", evidence={"engine": eid, "decisions": total,
                                                   "contradicted": bad},
                cause="stale read-queue reports (slow heartbeats) or thresholds that do not "
                      "fit the load", action="dualpath tune suggest --window 10m",
                rule=rule.name, why=v.why))
    return out


def _nic_errors(ev: Evidence, wf: str) -> list[Finding]:
    first, last = ev.samples[0].extras, ev.samples[-1].extras
    out = []
    for what, a, b in (("errors", first.nic_errors, last.nic_errors),
                       ("drops", first.nic_drops, last.nic_drops)):
        if a is None or b is None:
            continue
        if b > a:
            out.append(Finding(wf, WARNING, f"host NICs counted {b - a} new {what} in "
                               f"{ev.window_s:.0f} s", evidence={what: b - a},
                               cause="a faulty link, cable or switch port",
                               action="ip -s link; ethtool -S <device>"))
    return out


def _name(ev: Evidence, n: int, role: str) -> str:
    """Node index ``n``'s operator name (``--node D1``), from the window's views: joined
    nodes' indexes follow the order they joined, not their names."""
    view = ev.nodes.get(n)
    return node_name(view) if view is not None else node_name(n, role)
