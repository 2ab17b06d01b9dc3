"""The troubleshooting workflows as pure functions: :class:`Evidence` in, findings out.

Each workflow follows one section of the seed's troubleshooting guide (6.1 performance drop
with storage-NIC imbalance, 6.2 long tail, 6.3 scaling) or one of its monitor commands
(HBM fragmentation, per-layer cache hits). Thresholds are the named constants below; every
one is documented, with its reason, in docs/troubleshooting.md. A check whose inputs the
cluster does not report says so (a finding of severity OK with "not available") rather than
guessing.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from dualpath_cli.diagnose.model import (
    Change,
    Evidence,
    Finding,
    Report,
    Severity,
    engine_name,
    node_name,
)
from dualpath_cli.telemetry.view import Decision, LayerHits

__all__ = ["WORKFLOWS", "ALIASES", "run_workflow", "run_all", "snic_imbalance", "long_tail",
           "hbm_frag", "cache_hit", "scaling", "scheduler_cost", "histogram_quantile",
           "kv_waits", "change_reach_s"]

OK, WARNING, CRITICAL, UNKNOWN = (Severity.OK, Severity.WARNING, Severity.CRITICAL,
                                  Severity.UNKNOWN)

# --- thresholds (docs/troubleshooting.md explains each) ----------------------------------------
#: A condition is "persistent" when it holds in at least this share of the window's samples.
PERSIST_FRACTION = 0.5
#: Storage-NIC utilisation Max/Avg across the nodes of one role (seed 6.1; the paper's
#: balanced runs stay near 1.0-1.2).
SNIC_MAX_AVG_WARN = 1.3
SNIC_MAX_AVG_CRIT = 1.8
#: Below this mean utilisation a role's storage NICs are idle and their Max/Avg is noise.
SNIC_BUSY_MIN = 0.05
#: A node's storage-NIC bandwidth as a share of its role's median (a degraded link).
SNIC_BW_WARN = 0.75
SNIC_BW_CRIT = 0.5
#: A node whose storage NIC is this busy in most samples is saturated.
SNIC_SATURATED = 0.95
#: A change of alpha or the read side (audit log, controller step) is judged, reads to a slow
#: node before it against after it, when it happened inside the window or at most one window
#: length, and at least this many seconds, before its start (a re-check right after a fix).
CHANGE_REACH_MIN_S = 60.0
#: Fewest reads on each side of such a change for its before/after shares to be compared.
CHANGE_MIN_READS = 10
#: Share of an engine's decisions whose recorded class contradicts its inputs or the read
#: queue its node reported at the time.
MISCLASS_WARN = 0.1
#: TTFT P99/P50 over the window (seed 6.2: "P99 far above the mean").
TAIL_RATIO_WARN = 4.0
TAIL_RATIO_CRIT = 10.0
#: Fewest turns in the window for a TTFT quantile to mean anything.
TTFT_MIN_TURNS = 50
#: A block is hot when it takes at least this share of the store's block reads in the
#: window (or, where the store's total is not reported, this many times the mean reads of
#: the reported blocks), and at least HOT_BLOCK_MIN_READS reads.
HOT_BLOCK_SHARE = 0.1
HOT_BLOCK_FACTOR = 5.0
HOT_BLOCK_MIN_READS = 20
#: An engine is slow when its mean service time (busy seconds per batched request) over the
#: window is this multiple of its role peers' median, measured in at least
#: SLOW_SERVICE_MIN_SAMPLES samples.
SLOW_SERVICE_FACTOR = 2.0
SLOW_SERVICE_MIN_SAMPLES = 2
#: Prefills of a cached prefix that wait this long on average for their KV before they can
#: compute (the runtime loads the whole hit first): WARNING; CRITICAL at the second value.
KV_WAIT_WARN_S = 0.025
KV_WAIT_CRIT_S = 0.1
#: An engine is slow/overloaded when its unfinished requests stay at this multiple of its
#: role peers' median (and at least SLOW_ENGINE_MIN_SEQ) in most samples.
SLOW_ENGINE_FACTOR = 3.0
SLOW_ENGINE_MIN_SEQ = 2
#: HBM fragmentation score (1 - largest free run / free).
HBM_FRAG_WARN = 0.5
HBM_FRAG_CRIT = 0.8
#: Load-ahead slack below minus this is a bubble (layer 0 of a prefill always waits a little).
BUBBLE_TOLERANCE_S = 0.002
#: Share of layers with a bubble that makes it critical.
BUBBLE_LAYERS_CRIT = 0.5
#: Prompt tokens of follow-up turns (turn >= 1) found cached; agent turns extend their own
#: prefix, so a low ratio means the prefix store or the session routing is failing.
PREFIX_HIT_WARN = 0.5
PREFIX_MIN_TURNS = 10
#: Prefetched blocks a later request used.
PREFETCH_ACCURACY_WARN = 0.5
#: Fewest prefetched blocks on a node for its accuracy to be judged.
PREFETCH_MIN_BLOCKS = 20
#: Scheduler FIFO growth (requests over the window) while engines have headroom.
FIFO_GROWTH_WARN = 20
ENGINE_HEADROOM_UTIL = 0.5
#: Prefill busy against decode busy (GPU utilisation) that says the P/D ratio is off.
PD_BUSY_HIGH = 0.85
PD_BUSY_LOW = 0.3
#: Prefill-bound also needs work waiting on the prefill side: at least this many unfinished
#: requests per prefill engine on average (one running, one waiting). A lone agent keeps its
#: PE busy and its DEs idle, yet more prefill nodes would not serve it faster.
PD_QUEUE_MIN = 2.0
#: Compute-NIC utilisation Max/Avg across nodes.
CNIC_MAX_AVG_WARN = 1.5
#: Cores the scheduler's service thread used over the window: every decision runs on that
#: one thread, so near 1.0 it, not the engines, caps throughput.
SCHED_CPU_WARN = 0.7
SCHED_CPU_CRIT = 0.9
#: A kind of scheduling call's p99 wall time over the mean gap between two arriving requests:
#: at 1.0 one slow call takes a whole gap, and requests queue behind the scheduler.
DECISION_P99_WARN = 0.5
DECISION_P99_CRIT = 1.0
#: Fewest timed scheduling calls of a kind in the window before its p99 is judged.
DECISION_MIN_CALLS = 20
#: The timed scheduling calls' wall seconds over the thread's CPU seconds in the window:
#: above it the calls mostly waited for a CPU (a loaded host, the GIL held by the launcher's
#: other threads), which hierarchical scheduling would not fix.
DECISION_WAIT_FACTOR = 1.5



# --- small helpers ----------------------------------------------------------------------------
def _vals(series: Sequence[Any]) -> list[float]:
    return [float(v) for v in series if v is not None]


def _mean(series: Sequence[Any]) -> float | None:
    vals = _vals(series)
    return sum(vals) / len(vals) if vals else None


def _share(series: Sequence[Any], pred: Callable[[float], bool]) -> float:
    vals = _vals(series)
    return sum(1 for v in vals if pred(v)) / len(vals) if vals else 0.0


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def _tok(n: float) -> str:
    from dualpath_cli.units import format_tokens

    return format_tokens(n)


def _rate(first: Any, last: Any, dt: float) -> float | None:
    if first is None or last is None or dt <= 0:
        return None
    return max(0.0, (float(last) - float(first)) / dt)


def _role_nodes(ev: Evidence) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for n in ev.nodes.values():
        out.setdefault(n.role, []).append(n.node)
    return out


def _role_engines(ev: Evidence) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for e in ev.engines.values():
        out.setdefault(e.role, []).append(e.engine_id)
    return out


def _no_samples(workflow: str) -> Finding:
    return Finding(workflow, UNKNOWN, "no samples: nothing to diagnose",
                   cause="the window held no view of the cluster",
                   action="dualpath diagnose " + workflow + " --window 30s")


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile``: ``q`` of cumulative ``(le, count)`` buckets.

    Linear inside the bucket; the +Inf bucket answers its lower bound. ``None`` when empty.
    """
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


# --- 6.1 performance drop / storage-NIC imbalance -----------------------------------------------
def snic_imbalance(ev: Evidence) -> list[Finding]:
    """Storage NICs per node and role: Max/Avg, bandwidth against peers, saturation, read
    queues over alpha that decisions ignored, classes the inputs contradict, NIC errors."""
    wf = "snic-imbalance"
    if not ev.samples:
        return [_no_samples(wf)]
    out: list[Finding] = []
    util = ev.node_series("snic_utilization")
    bw = ev.node_series("snic_bandwidth_bytes_per_s")
    rq = ev.node_series("read_queue_tokens")
    alpha = ev.alpha_series
    all_bw = {n: m for n, m in ((n, _mean(s)) for n, s in bw.items()) if m}
    for role, ids in sorted(_role_nodes(ev).items()):
        means = {n: _mean(util.get(n, ())) for n in ids}
        known = {n: m for n, m in means.items() if m is not None}
        if len(known) >= 2:
            avg = sum(known.values()) / len(known)
            hot = max(known, key=lambda n: known[n])
            if avg >= SNIC_BUSY_MIN:
                ratio = known[hot] / avg
                sev = (CRITICAL if ratio >= SNIC_MAX_AVG_CRIT else
                       WARNING if ratio >= SNIC_MAX_AVG_WARN else OK)
                name = node_name(hot, role)
                out.append(Finding(
                    wf, sev, f"{role} storage NICs Max/Avg {ratio:.2f} over "
                    f"{ev.window_s:.0f} s (busiest node {name} at {_pct(known[hot])})",
                    subject=f"node {name}" if sev else None,
                    evidence={"role": role, "max_avg": round(ratio, 3),
                              "utilization": {node_name(n, role): round(v, 3)
                                              for n, v in known.items()}},
                    cause=f"reads pile onto node {name}" if sev else None,
                    action=("dualpath-monitor --metric snic_util --by-node --interval 1s"
                            if sev else None)))
        # bandwidth against the role's median (a throttled or degraded link)
        bws = {n: _mean(bw.get(n, ())) for n in ids}
        known_bw = {n: b for n, b in bws.items() if b}
        if len(known_bw) >= 2:
            for n, b in sorted(known_bw.items()):
                # expected: what the role's other nodes have (a pair judges each by the other)
                med = statistics.median(v for m, v in known_bw.items() if m != n)
                frac = b / med if med else 1.0
                if frac < SNIC_BW_WARN:
                    out.append(_degraded_link(ev, n, role, b, med, frac, all_bw, alpha))
        for n in ids:
            name = node_name(n, role)
            if _share(util.get(n, ()), lambda v: v >= SNIC_SATURATED) >= PERSIST_FRACTION:
                busy = _share(util[n], lambda v: v >= SNIC_SATURATED)
                out.append(Finding(
                    wf, WARNING, f"node {name} storage NIC saturated (>= "
                    f"{_pct(SNIC_SATURATED)}) in {_pct(busy)} of samples",
                    subject=f"node {name}",
                    evidence={"node": name, "mean_utilization": _mean(util[n])},
                    cause=f"more reads than {name}'s storage NIC can carry",
                    action="dualpath tune suggest --window 10m"))
            series = rq.get(n, [])
            over = [q > a for q, a in zip(series, alpha, strict=False) if q is not None]
            if over and sum(over) / len(over) >= PERSIST_FRACTION:
                sent = _reads_to_node(ev, n)
                total = sum(1 for d in ev.decisions)
                mean_q = _mean(series) or 0.0
                out.append(Finding(
                    wf, WARNING, f"node {name} read queue {_tok(mean_q)} tok over alpha "
                    f"{_tok(alpha[-1])} in {_pct(sum(over) / len(over))} of samples; "
                    f"{sent}/{total} reads still sent to {name}",
                    subject=f"node {name}",
                    evidence={"node": name, "mean_read_queue_tokens": mean_q,
                              "alpha_tokens": alpha[-1], "reads_sent": sent,
                              "decisions": total},
                    cause=f"{name} reads slower than it is given work",
                    action=f"dualpath tune set alpha={_tok(max(1, alpha[-1] // 2))}"))
    out.extend(_misclassified(ev, wf))
    out.extend(_nic_errors(ev, wf))
    if not out:
        shaped = any(v is not None for s in util.values() for v in s)
        out.append(Finding(wf, OK, "storage NICs: no imbalance, no degraded link, read queues "
                           "within alpha" + ("" if shaped else
                                             " (utilisation not available: unshaped NICs)"),
                           evidence={"nodes": len(ev.nodes)}))
    return out


def _degraded_link(ev: Evidence, n: int, role: str, b: float, med: float, frac: float,
                   all_bw: dict[int, float], alpha: Sequence[int]) -> Finding:
    """A node's storage NIC below its peers' bandwidth. Lowering alpha cannot mend the link,
    only steer reads away, so once the node takes no more than its share of the cluster's
    storage bandwidth in reads the finding is a WARNING that asks for no further step (the
    operator who applied the CRITICAL's ``tune set`` was told to halve alpha again forever).

    After a change of alpha or the read side in reach (:func:`change_reach_s`), the reads
    since it are judged, and the finding says how the node's share of reads moved: before
    the change (over as long before it as has passed since) against after it."""
    name = node_name(n, role)
    sent = _reads_to_node(ev, n)
    reads = sum(1 for d in ev.decisions if _is_read(d))
    fair = b / sum(all_bw.values()) if all_bw else 0.0
    evidence: dict[str, Any] = {"node": name, "bandwidth_bytes_per_s": b,
                                "expected_bytes_per_s": med, "fraction": round(frac, 3),
                                "reads_sent": sent, "decisions": reads,
                                "bandwidth_share": round(fair, 3)}
    moved = _reads_since_change(ev, n)
    if moved is not None:
        evidence.update(moved["evidence"])
    if moved is not None and moved["compared"]:
        sent, reads = moved["after"]  # what the change left is what counts now
    steered = reads > 0 and sent / reads <= fair
    link = f"{_gbs(b)} vs {_gbs(med)}, the other {role} nodes' median"
    check = f"check the storage NIC of {name} (ethtool -S, dmesg)"
    severe = CRITICAL if frac < SNIC_BW_CRIT else WARNING
    steer = (f"{check}; meanwhile steer reads away: dualpath tune set alpha="
             f"{_tok(max(1, min(alpha) // 2))}")
    if moved is not None and moved["compared"]:
        (b_sent, b_reads), share = moved["before"], sent / reads
        before = b_sent / b_reads
        trend = (f"down from {_pct(before)} to {_pct(share)}"
                 if round(share * 100) < round(before * 100) else
                 f"not down ({_pct(before)} before, {_pct(share)} after)")
        title = (f"node {name} storage NIC still slow; reads to {name} {trend} since "
                 f"{moved['since']}")
        if steered:
            return Finding(
                "snic-imbalance", WARNING, title, subject=f"node {name}", evidence=evidence,
                cause=f"a degraded or throttled storage link on {name} (at {_pct(frac)} of "
                      f"expected: {link}); reads to it ({sent}/{reads}) are within its "
                      f"{_pct(fair)} share of the storage bandwidth", action=check)
        return Finding(
            "snic-imbalance", severe, title, subject=f"node {name}", evidence=evidence,
            cause=f"a degraded or throttled storage link on {name} (at {_pct(frac)} of "
                  f"expected: {link}); reads to it ({sent}/{reads}) still over its "
                  f"{_pct(fair)} share of the storage bandwidth", action=steer)
    title = f"node {name} storage NIC at {_pct(frac)} of expected ({link})"
    if steered:
        return Finding(
            "snic-imbalance", WARNING, f"node {name} storage NIC still at {_pct(frac)} of expected "
            f"({_gbs(b)} vs {_gbs(med)}); reads to {name} {_pct(sent / reads)} ({sent}/"
            f"{reads}), within its {_pct(fair)} share of the storage bandwidth",
            subject=f"node {name}", evidence=evidence,
            cause=f"a degraded or throttled storage link on {name}; reads already avoid it",
            action=check)
    if reads:
        title += f"; {_pct(sent / reads)} of reads ({sent}/{reads}) still sent to {name}"
    return Finding(
        "snic-imbalance", severe, title,
        subject=f"node {name}", evidence=evidence,
        cause=f"a degraded or throttled storage link on {name}",
        action=steer)


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
    return _tok(value)


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
    for eid, (total, bad) in sorted(per_engine.items()):
        if total and bad / total >= MISCLASS_WARN and eid in engines:
            e = engines[eid]
            out.append(Finding(
                wf, WARNING, f"{engine_name(e)}: {bad} of {total} decisions classed it "
                "against what its read queue and tokens say (alpha/beta)",
                subject=f"engine {eid}", evidence={"engine": eid, "decisions": total,
                                                   "contradicted": bad},
                cause="stale read-queue reports (slow heartbeats) or thresholds that do not "
                      "fit the load", action="dualpath tune suggest --window 10m"))
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


# --- 6.2 long tail ------------------------------------------------------------------------------
def _ttft_window(ev: Evidence) -> tuple[list[tuple[float, float]], str]:
    first, last = ev.samples[0].extras, ev.samples[-1].extras
    if not last.ttft_buckets:
        return [], "not available"
    if first.ttft_buckets and len(first.ttft_buckets) == len(last.ttft_buckets):
        delta = [(le, float(c - c0)) for (le, c), (_, c0)
                 in zip(last.ttft_buckets, first.ttft_buckets, strict=True)]
        if delta and delta[-1][1] >= TTFT_MIN_TURNS:
            return delta, "window"
    return [(le, float(c)) for le, c in last.ttft_buckets], "since start"


def long_tail(ev: Evidence) -> list[Finding]:
    """TTFT P99/P50, hot blocks, engines persistently over beta or far behind their peers,
    fragmented HBM (seed 6.2)."""
    wf = "long-tail"
    if not ev.samples:
        return [_no_samples(wf)]
    out: list[Finding] = []
    buckets, scope = _ttft_window(ev)
    turns = buckets[-1][1] if buckets else 0
    if buckets and turns >= TTFT_MIN_TURNS:
        p50 = histogram_quantile(0.5, buckets)
        p99 = histogram_quantile(0.99, buckets)
        if p50 and p99:
            ratio = p99 / p50
            sev = (CRITICAL if ratio >= TAIL_RATIO_CRIT else
                   WARNING if ratio >= TAIL_RATIO_WARN else OK)
            if scope != "window":  # since start mixes in warm-up and old incidents
                sev = min(sev, WARNING)
            out.append(Finding(
                wf, sev, f"TTFT P99/P50 {ratio:.1f} (P50 {p50 * 1e3:.0f} ms, P99 "
                f"{p99 * 1e3:.0f} ms, {turns:.0f} turns {scope})",
                evidence={"p50_s": p50, "p99_s": p99, "ratio": round(ratio, 3),
                          "turns": turns, "scope": scope},
                cause="see the hot-block, engine and HBM findings" if sev else None,
                action="dualpath tune set quota=150ms" if sev else None))
    else:
        out.append(Finding(wf, OK, f"TTFT tail: too few turns ({turns:.0f} < "
                           f"{TTFT_MIN_TURNS}) or histogram {scope}",
                           evidence={"turns": turns}))
    out.extend(_hot_blocks(ev, wf))
    out.extend(_slow_engines(ev, wf))
    out.extend(_slow_service(ev, wf))
    out.extend(f for f in ev.memo("hbm-frag", lambda: hbm_frag(ev))
               if f.severity in (WARNING, CRITICAL))
    return [dataclass_replace(f, workflow=wf) for f in out]


def dataclass_replace(f: Finding, **kw: Any) -> Finding:
    """``f`` with fields changed (a finding borrowed by another workflow)."""
    import dataclasses

    return dataclasses.replace(f, **kw)


def _hot_blocks(ev: Evidence, wf: str) -> list[Finding]:
    """Blocks read far more than the rest: a share of the store's reads in the window (the
    runtime exports each engine's most-read blocks only), else against the reported mean."""
    x0, x1 = ev.samples[0].extras, ev.samples[-1].extras
    first, last = x0.block_reads, x1.block_reads
    if not last:
        return [Finding(wf, OK, "hot blocks: per-block read counts not available from this "
                        "cluster", evidence={"block_reads": None})]
    # a block that entered the exported top only later counts whole (an upper bound)
    reads = {k: v - first.get(k, 0) for k, v in last.items()} if len(ev.samples) > 1 else last
    reads = {k: v for k, v in reads.items() if v > 0}
    if not reads:
        return []
    total = None
    if x1.store_block_reads is not None:
        total = x1.store_block_reads - (x0.store_block_reads or 0 if len(ev.samples) > 1
                                        else 0)
        total = total if total > 0 else None
    mean = sum(reads.values()) / len(reads)
    if total is not None:
        floor, basis = HOT_BLOCK_SHARE * total, (f"{_pct(HOT_BLOCK_SHARE)} of the store's "
                                                 f"{total} block reads")
    else:
        floor, basis = HOT_BLOCK_FACTOR * mean, f"{HOT_BLOCK_FACTOR:g}x the mean {mean:.1f}"
    spread = _copy_spread(ev, reads)
    # a block with copies is a hot spot only where one copy still takes the hot share: the
    # storage target holding that copy is what saturates (reads before the readers found
    # the copies count against the busiest copy: an upper bound)
    load = {k: spread[k][0] if k in spread else v for k, v in reads.items()}
    hot = sorted(((v, k) for k, v in reads.items()
                  if v >= HOT_BLOCK_MIN_READS and load[k] >= floor), reverse=True)
    # a copied block read often enough to have been hot says how its reads spread, whatever
    # share of the window's reads it still takes (a workload's contexts grow: the hot block's
    # share of all reads falls while it is read as often, and the operator asks "did my
    # copies take the reads?")
    cooled = sorted(((v, k) for k, v in reads.items()
                     if k in spread and v >= HOT_BLOCK_MIN_READS and load[k] < floor),
                    reverse=True)
    out: list[Finding] = []
    for v, k in cooled[:5]:
        busiest, per_root = spread[k]
        out.append(Finding(
            wf, OK, f"block {k[:12]} read {v} times in {ev.window_s:.0f} s, spread over "
            f"{len(per_root)} copies (at most {busiest} from one root: under the hot "
            f"share, {basis})", evidence={"block": k, "reads": v, "copy_reads": per_root,
                                         "busiest_copy_reads": busiest}))
    if not hot:
        if out:
            return out
        return [Finding(wf, OK, f"no hot block: the most-read block read "
                        f"{max(reads.values())} times in {ev.window_s:.0f} s (hot: >= "
                        f"{HOT_BLOCK_MIN_READS} and >= {basis})",
                        evidence={"blocks": len(reads), "store_block_reads": total})]
    names = [k for _, k in hot[:5]]
    top_v, top_k = hot[0]
    share = f", {_pct(top_v / total)} of the store's block reads" if total else ""
    # copies that would leave each one under half the hot share (what --fix asks for)
    needed = {k: max(2, math.ceil(reads[k] / max(floor / 2, 1))) for k in names}
    have = {k: len(spread[k][1]) for k in names if k in spread}
    copied = (f"; {have[top_k]} copies, {spread[top_k][0]} reads on the busiest"
              if top_k in have else "")
    out.append(Finding(
        wf, WARNING, f"block {top_k[:12]} read {top_v} times in {ev.window_s:.0f} s (hot"
        f"{share}; {len(hot)} hot blocks{copied})",
        subject=f"block {top_k}",
        evidence={"hot_blocks": {k: reads[k] for k in names}, "mean_reads": mean,
                  "store_block_reads": total, "copies_needed": needed,
                  "copies": have},
        cause="storage hot spot: many turns (or one reader) hammer these blocks",
        action=f"dualpath diagnose long-tail --fix   (copies the {len(names)} hot blocks "
               f"to every replica root, at least {max(needed.values())} copies each; a store "
               "without them: launch --replica-root DIR; dualpath storage inspect <root> "
               "--top 20 lists the hot blocks)"))
    return out


def _copy_spread(ev: Evidence, reads: dict[str, int]) -> dict[str, tuple[int, dict[str,
                                                                                  int]]]:
    """For each block with copies serving it in the window: the reads of its busiest copy
    (the reads not attributed to a copy added to it) and the window's reads per root."""
    x0, x1 = ev.samples[0].extras, ev.samples[-1].extras
    out: dict[str, tuple[int, dict[str, int]]] = {}
    for k, per_root in x1.block_copy_reads.items():
        before = x0.block_copy_reads.get(k, {}) if len(ev.samples) > 1 else {}
        window = {r: n - before.get(r, 0) for r, n in per_root.items()}
        counted = sum(max(0, n) for n in window.values())
        if k not in reads or len(window) < 2 or counted <= 0:
            continue
        busiest = max(window.values()) + max(0, reads[k] - counted)
        out[k] = (busiest, window)
    return out


def _slow_engines(ev: Evidence, wf: str) -> list[Finding]:
    seq = ev.engine_series("seq")
    tokens = ev.engine_series("tokens")
    beta = ev.beta_series
    out = []
    # each sample's median per role: a peer group's typical load (one slow engine among
    # many barely moves it; with two engines it is their mean)
    medians: dict[str, list[float | None]] = {}
    for role, ids in _role_engines(ev).items():
        medians[role] = []
        for i in range(len(ev.samples)):
            vals = [seq[p][i] for p in ids if i < len(seq.get(p, ()))]
            medians[role].append(statistics.median(vals) if vals else None)
    for role, ids in sorted(_role_engines(ev).items()):
        for eid in ids:
            e = ev.engines[eid]
            over = [t > b for t, b in zip(tokens.get(eid, ()), beta, strict=False)]
            if over and sum(over) / len(over) >= PERSIST_FRACTION:
                out.append(Finding(
                    wf, WARNING, f"{engine_name(e)} over beta {_tok(beta[-1])} tok in "
                    f"{_pct(sum(over) / len(over))} of samples", subject=f"engine {eid}",
                    evidence={"engine": eid, "mean_tokens": _mean(tokens[eid]),
                              "beta_tokens": beta[-1]},
                    cause="the scheduler keeps this engine overloaded",
                    action=f"dualpath tune set beta={_tok(max(1, beta[-1] * 3 // 4))}"))
                continue
            if len(ids) < 2:
                continue
            mine = seq.get(eid, [])
            behind = 0
            for i, v in enumerate(mine):
                if v < SLOW_ENGINE_MIN_SEQ:
                    continue
                if len(ids) <= 3:  # a small group: the others alone are the yardstick
                    others = [seq[p][i] for p in ids if p != eid and i < len(seq[p])]
                    med = statistics.median(others) if others else None
                else:
                    med = medians[role][i] if i < len(medians[role]) else None
                if med is not None and v >= SLOW_ENGINE_FACTOR * max(med, 0.5):
                    behind += 1
            if mine and behind / len(mine) >= PERSIST_FRACTION:
                util = _mean(ev.engine_series("gpu_utilization").get(eid, ()))
                out.append(Finding(
                    wf, WARNING, f"{engine_name(e)} holds {_mean(mine):.1f} unfinished "
                    f"requests on average, >= {SLOW_ENGINE_FACTOR:g}x its {role} peers, in "
                    f"{_pct(behind / len(mine))} of samples",
                    subject=f"engine {eid}",
                    evidence={"engine": eid, "mean_seq": _mean(mine),
                              "peers_median_seq": _mean(medians[role]),
                              "gpu_utilization": util},
                    cause="a slow engine (throttled GPU, noisy neighbour) finishing its "
                          "turns late", action="dualpath stop && dualpath launch   (restart; "
                          "or drain the node) ; dynamic quota: dualpath tune set quota=150ms"))
    return out


def _slow_service(ev: Evidence, wf: str) -> list[Finding]:
    """Engines whose service time (busy seconds per batched request, windowed) is far above
    their role peers' over the window (a throttled GPU, a noisy neighbour).

    Means over the samples that measured one, not sample by sample: engines of a role take
    turns at having work, so two of them are often not measured in the same second.
    """
    svc = ev.engine_series("service_time_s")
    out = []
    for role, ids in sorted(_role_engines(ev).items()):
        means = {}
        for eid in ids:
            vals = _vals(svc.get(eid, ()))
            if len(vals) >= SLOW_SERVICE_MIN_SAMPLES:
                means[eid] = (sum(vals) / len(vals), len(vals))
        if len(means) < 2:
            continue
        # a big role's median barely moves for one slow engine; a small one judges each
        # engine by the others alone
        role_med = statistics.median(m for m, _ in means.values())
        for eid, (mean, n) in sorted(means.items()):
            med = (statistics.median(m for p, (m, _) in means.items() if p != eid)
                   if len(means) <= 3 else role_med)
            if med <= 0 or mean < SLOW_SERVICE_FACTOR * med:
                continue
            e = ev.engines[eid]
            out.append(Finding(
                wf, WARNING, f"{engine_name(e)} serves a request in {mean * 1e3:.1f} ms of "
                f"compute, {mean / med:.1f}x its {role} peers' {med * 1e3:.1f} ms ({n} "
                "samples)", subject=f"engine {eid}",
                evidence={"engine": eid, "mean_service_time_s": mean,
                          "peers_service_time_s": med, "ratio_to_peers": round(mean / med, 3),
                          "samples": n},
                cause="a slow engine (throttled GPU, noisy neighbour): its turns finish late",
                action="drain and restart it: dualpath stop && dualpath launch ; meanwhile "
                       "dynamic quota: dualpath tune set quota=150ms"))
    return out


# --- HBM fragmentation --------------------------------------------------------------------------
def hbm_frag(ev: Evidence) -> list[Finding]:
    """Fragmentation score per engine; its largest free run against the largest recent
    request placed on it."""
    wf = "hbm-frag"
    if not ev.samples:
        return [_no_samples(wf)]
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
    for eid, series in sorted(frag.items()):
        vals = _vals(series)
        if not vals:
            continue
        last = vals[-1]
        worst = max(worst, last)
        if last < HBM_FRAG_WARN:
            continue
        e = ev.engines[eid]
        sev = CRITICAL if last >= HBM_FRAG_CRIT else WARNING
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
            extra = f"; largest free run ~{_tok(largest)} tok vs {_tok(need[eid])} tok needed"
            if largest < need[eid]:
                sev = CRITICAL
                extra += " (does not fit)"
        out.append(Finding(
            wf, sev, f"{engine_name(e)} HBM fragmentation {last:.2f}{extra}",
            subject=f"engine {eid}", evidence=ev_d,
            cause="KV blocks freed out of order left the pool in small runs",
            action=f"dualpath diagnose hbm-frag --fix   (compacts engine {eid}'s HBM)"))
    if not out:
        out.append(Finding(wf, OK, f"HBM fragmentation at most {worst:.2f} on "
                           f"{len(frag)} engines", evidence={"max_fragmentation": worst}))
    return out


# --- cache hits ---------------------------------------------------------------------------------
def layer_table(ev: Evidence) -> list[dict[str, Any]]:
    """Per layer over the window: blocks by tier (and shares), median and worst slack."""
    first: dict[tuple[int, int], tuple[int, int, int]] = {}
    for e in ev.samples[0].view.engines if len(ev.samples) > 1 else ():
        for h in e.layers:
            first[(e.engine_id, h.layer)] = (h.dram, h.store, h.peer)
    acc: dict[int, list[Any]] = {}
    for e in ev.last.engines:
        for h in e.layers:
            d0, s0, p0 = first.get((e.engine_id, h.layer), (0, 0, 0))
            row = acc.setdefault(h.layer, [0, 0, 0, []])
            row[0] += h.dram - d0
            row[1] += h.store - s0
            row[2] += h.peer - p0
    # slack: each engine's last prefill as seen by every sample (one prefill is noise); the
    # same prefill seen by consecutive samples counts once
    last_seen: dict[int, tuple[LayerHits, ...]] = {}
    for s in ev.samples:
        for e in s.view.engines:
            layers = e.layers
            if not layers:
                continue
            prev = last_seen.get(e.engine_id)
            last_seen[e.engine_id] = layers
            for i, h in enumerate(layers):
                if h.slack_s is None or h.layer not in acc:
                    continue
                if prev is not None and i < len(prev) and prev[i].slack_s == h.slack_s:
                    continue
                acc[h.layer][3].append(h.slack_s)
    rows = []
    for layer in sorted(acc):
        dram, store, peer, slacks = acc[layer]
        total = dram + store + peer
        rows.append({"layer": layer, "dram": dram, "store": store, "peer": peer,
                     "dram_share": dram / total if total else None,
                     "store_share": store / total if total else None,
                     "peer_share": peer / total if total else None,
                     "slack_s": statistics.median(slacks) if slacks else None,
                     "worst_slack_s": min(slacks) if slacks else None})
    return rows


def cache_hit(ev: Evidence, by_layer: bool = False) -> list[Finding]:
    """Prefix hits of follow-up turns, layers whose KV arrives after compute starts,
    prefetch accuracy; ``by_layer`` adds the per-layer table to the evidence."""
    wf = "cache-hit"
    if not ev.samples:
        return [_no_samples(wf)]
    out: list[Finding] = []
    follow = [d for d in ev.decisions if d.turn > 0 and d.attempt == 0]
    if len(follow) >= PREFIX_MIN_TURNS:
        prompt = sum(d.length for d in follow)
        cached = sum(d.cached for d in follow)
        ratio = cached / prompt if prompt else 0.0
        out.append(Finding(
            wf, WARNING if ratio < PREFIX_HIT_WARN else OK,
            f"follow-up turns found {_pct(ratio)} of their prompt tokens cached "
            f"({len(follow)} turns)", evidence={"prefix_hit_ratio": round(ratio, 4),
                                                "turns": len(follow)},
            cause=("the prefix store lost blocks (evicted, gc, capacity) or sessions are not "
                   "kept on their chain") if ratio < PREFIX_HIT_WARN else None,
            action="dualpath storage verify <store>; dualpath-monitor --metric cache_hit "
                   "--by-layer" if ratio < PREFIX_HIT_WARN else None))
    else:
        out.append(Finding(wf, OK, f"prefix hits: {len(follow)} follow-up turns in the "
                           f"window (< {PREFIX_MIN_TURNS}), no verdict",
                           evidence={"turns": len(follow)}))
    rows = layer_table(ev)
    judged = [r for r in rows if r["layer"] > 0]  # layer 0 has no layer to overlap with
    late = [r for r in judged
            if r["slack_s"] is not None and r["slack_s"] < -BUBBLE_TOLERANCE_S]
    if judged:
        sev = (CRITICAL if len(late) >= max(1, BUBBLE_LAYERS_CRIT * len(judged)) else
               WARNING if late else OK)
        text = (f"{len(late)} of {len(judged)} layers load after compute starts (worst slack "
                f"{min(r['slack_s'] for r in late) * 1e3:.1f} ms, layers "
                f"{', '.join(str(r['layer']) for r in late[:8])})" if late else
                f"layers 1..{len(rows) - 1} loaded ahead of compute (median slack >= "
                f"-{BUBBLE_TOLERANCE_S * 1e3:g} ms)")
        evidence: dict[str, Any] = {"late_layers": [r["layer"] for r in late]}
        if by_layer:
            evidence["layers"] = rows
        out.append(Finding(wf, sev, text, evidence=evidence,
                           cause="storage reads slower than layer compute (a slow storage "
                                 "NIC, or too little read-ahead)" if late else None,
                           action="dualpath diagnose snic-imbalance --window 60s"
                           if late else None))
    out.extend(_kv_wait(ev, wf))
    last = ev.samples[-1].extras
    acc = {n: a for n, a in last.prefetch_accuracy.items()
           if last.prefetched_blocks.get(n, 0) >= PREFETCH_MIN_BLOCKS}
    if acc:
        low = {n: a for n, a in acc.items() if a < PREFETCH_ACCURACY_WARN}
        out.append(Finding(
            wf, WARNING if low else OK,
            f"prefetch accuracy {min(acc.values()):.2f}..{max(acc.values()):.2f} over "
            f"{len(acc)} nodes", evidence={"prefetch_accuracy": acc},
            cause="prefetch reads blocks no turn uses" if low else None,
            action="dualpath-monitor --metric prefetch_accuracy --by-node" if low else None))
    return out


def kv_waits(ev: Evidence) -> dict[int, float]:
    """Each prefill engine's mean wait for its cached KV (seconds) over the samples that
    measured one (engines that served no prefill of a cached prefix are left out)."""
    out = {}
    for eid, series in ev.engine_series("kv_wait_s").items():
        vals = _vals(series)
        if vals:
            out[eid] = sum(vals) / len(vals)
    return out


def _kv_wait(ev: Evidence, wf: str) -> list[Finding]:
    """Prefills that wait for their whole hit to load before computing: the bubble the
    per-layer slack cannot show (it is measured after the load)."""
    waits = kv_waits(ev)
    if not waits:
        return []
    out = []
    for eid, mean in sorted(waits.items()):
        if mean < KV_WAIT_WARN_S:
            continue
        e = ev.engines[eid]
        svc = _mean(ev.engine_series("service_time_s").get(eid, ()))
        vs = f" (its compute per request {svc * 1e3:.1f} ms)" if svc else ""
        out.append(Finding(
            wf, CRITICAL if mean >= KV_WAIT_CRIT_S else WARNING,
            f"{engine_name(e)}: prefills of a cached prefix wait {mean * 1e3:.1f} ms on "
            f"average for their KV before computing{vs}", subject=f"node {node_name(e)}",
            evidence={"engine": eid, "node": node_name(e), "mean_kv_wait_s": round(mean, 6),
                      "service_time_s": svc},
            cause=f"slow store reads on node {node_name(e)} (read latency, a slow or throttled "
                  "storage NIC): the prefill cannot start until its hit is loaded",
            action="dualpath diagnose snic-imbalance --window 60s; dualpath storage bench "
                   "--root <store>"))
    if not out:
        worst = max(waits.values())
        out.append(Finding(wf, OK, f"prefills wait at most {worst * 1e3:.1f} ms on average for "
                           f"their cached KV ({len(waits)} engines; < "
                           f"{KV_WAIT_WARN_S * 1e3:g} ms)",
                           evidence={"kv_wait_s": {str(k): round(v, 6)
                                                   for k, v in waits.items()}}))
    return out


# --- 6.3 scaling --------------------------------------------------------------------------------
def scaling(ev: Evidence) -> list[Finding]:
    """Scheduler throughput against demand, the P/D balance of GPU busy, compute-NIC
    traffic per node (seed 6.3)."""
    wf = "scaling"
    if not ev.samples:
        return [_no_samples(wf)]
    out: list[Finding] = []
    first, last = ev.samples[0].view.scheduler, ev.samples[-1].view.scheduler
    dt = ev.window_s
    rate = (last.decisions.total - first.decisions.total) / dt if dt > 0 else None
    growth = last.fifo_length - first.fifo_length
    util = ev.engine_series("gpu_utilization")
    all_util = _mean([v for s in util.values() for v in s])
    headroom = all_util is not None and all_util < ENGINE_HEADROOM_UTIL
    if growth >= FIFO_GROWTH_WARN and headroom:
        out.append(Finding(
            wf, WARNING, f"scheduler FIFO grew by {growth} requests over {dt:.0f} s while "
            f"engines were {_pct(all_util or 0)} busy ({rate or 0:.1f} decisions/s)",
            evidence={"fifo_growth": growth, "decisions_per_s": rate,
                      "gpu_utilization": all_util},
            cause="the scheduler, not the engines, limits throughput",
            action=_scale_scheduler(last, ev.last.pd)))
    else:
        out.append(Finding(wf, OK, f"scheduler keeps up: {rate or 0:.1f} decisions/s, FIFO "
                           f"{last.fifo_length} ({growth:+d} over {dt:.0f} s)",
                           evidence={"decisions_per_s": rate, "fifo": last.fifo_length,
                                     "fifo_growth": growth}))
    out.extend(scheduler_cost(ev, wf))
    by_role, in_batch = role_busy(ev)
    p, d = by_role.get("prefill"), by_role.get("decode")
    view = ev.last
    if p is not None and d is not None:
        n_p = sum(1 for n in ev.nodes.values() if n.role == "prefill")
        n_d = sum(1 for n in ev.nodes.values() if n.role == "decode")
        seq = ev.engine_series("seq")
        queue = _mean([v for eid in _role_engines(ev).get("prefill", ())
                       for v in seq.get(eid, ())]) or 0.0
        if p >= PD_BUSY_HIGH and d <= PD_BUSY_LOW:
            shape, cause, busy = f"{n_p + 1}P{max(1, n_d - 1)}D", "prefill-bound", "prefill"
        elif d >= PD_BUSY_HIGH and p <= PD_BUSY_LOW:
            shape, cause, busy = f"{max(1, n_p - 1)}P{n_d + 1}D", "decode-bound", "decode"
        else:
            shape, cause, busy = "", "", ""
        if busy == "prefill" and queue < PD_QUEUE_MIN:
            shape = ""
            out.append(Finding(
                wf, OK, f"{view.pd}: prefill GPUs {_pct(p)} busy, decode {_pct(d)}, but "
                f"{queue:.1f} requests per prefill engine (< {PD_QUEUE_MIN:g}): none wait "
                "for a prefill, so more prefill nodes would add no throughput",
                evidence={"pd": view.pd, "prefill_busy": p, "decode_busy": d,
                          "prefill_requests_per_engine": queue}))
        if shape:
            note = (f"; {in_batch} prefill-engine samples inside a batch longer than the "
                    "window" if in_batch else "")
            out.append(Finding(
                wf, WARNING, f"{view.pd}: prefill GPUs {_pct(p)} busy, decode {_pct(d)} "
                f"({cause}{note}); adding nodes of the busy role helps, the other does not",
                subject=f"role {busy}",
                evidence={"pd": view.pd, "prefill_busy": p, "decode_busy": d,
                          "bottleneck": busy, "suggested_pd": shape,
                          "prefill_samples_in_long_batch": in_batch,
                          "prefill_requests_per_engine": queue},
                cause=f"the {busy} side is the bottleneck: the P/D ratio {view.pd} is "
                      f"outside the bottleneck-free range for this load ({cause})",
                action=f"move a node to {busy}: dualpath plan pd-ratio --pd {shape} (checks "
                       f"{shape} against the range), then dualpath stop && dualpath launch "
                       f"--pd {shape}"))
        elif not busy and (p >= PD_BUSY_HIGH or d >= PD_BUSY_HIGH):
            out.append(Finding(
                wf, OK, f"{view.pd}: prefill GPUs {_pct(p)} busy, decode {_pct(d)}: both "
                "sides loaded, no P/D bottleneck", evidence={"pd": view.pd,
                                                             "prefill_busy": p,
                                                             "decode_busy": d}))
    cutil = {n: _mean(s) for n, s in ev.node_series("cnic_utilization").items()}
    known = {n: v for n, v in cutil.items() if v is not None}
    if len(known) >= 2:
        avg = sum(known.values()) / len(known)
        hot = max(known, key=lambda n: known[n])
        if avg >= SNIC_BUSY_MIN and known[hot] / avg >= CNIC_MAX_AVG_WARN:
            name = node_name(ev.nodes[hot])
            out.append(Finding(
                wf, WARNING, f"compute NICs Max/Avg {known[hot] / avg:.2f} (node {name} at "
                f"{_pct(known[hot])})", subject=f"node {name}",
                evidence={"cnic_utilization": {node_name(ev.nodes[n]): v
                                               for n, v in known.items()}},
                cause="cross-node traffic concentrates on one node (topology, placement)",
                action="dualpath plan pd-ratio --pd " + view.pd))
    return out


#: What to do when the scheduler itself is the bottleneck (honest about what is built).
_HIERARCHICAL = (
    "hierarchical scheduling (scheduler.hierarchical: sub-schedulers each own a share of the "
    "engine groups, so a decision scans fewer groups; it runs for a launch's own engines, "
    "not with --join or Ray nodes); check what it gains at this shape first: dualpath sim "
    "run --pd {pd} --set scheduler.hierarchical=true (against dualpath sim run --pd {pd}), "
    "then launch with --set scheduler.hierarchical=true; keep a core free for the "
    "scheduler on the launcher's host")
#: The same when the hierarchy is already on (the root's routing is timed: ``root_route``).
_MORE_SUBS = (
    "hierarchical scheduling is on: give it more sub-schedulers (scheduler.sub_schedulers, "
    "each must keep one prefill and one decode group; check the gain first: dualpath sim "
    "run --pd {pd} --set scheduler.hierarchical=true --set scheduler.sub_schedulers=N); "
    "the subs are threads of one launcher and share its interpreter lock, so keep a core "
    "free for it on the launcher's host")


def _scale_scheduler(scheduler: Any, pd: str) -> str:
    """The remedy for a saturated scheduler: the hierarchy, or more subs when it is on."""
    on = "root_route" in (getattr(scheduler, "decision_latency", None) or {})
    return (_MORE_SUBS if on else _HIERARCHICAL).format(pd=pd)


def _queued(view: Any) -> int:
    s = view.scheduler
    return s.fifo_length + sum(s.private_queues.values()) + s.pe_queue_length


def _window_buckets(first: Any, last: Any) -> tuple[list[tuple[float, float]], int, float]:
    """A latency histogram's cumulative buckets (with +Inf), count and sum over the window;
    since start when the first sample has no comparable histogram."""
    base = first if (first is not None and len(first.buckets) == len(last.buckets)) else None
    out = [(le, float(c - (base.buckets[i][1] if base else 0)))
           for i, (le, c) in enumerate(last.buckets)]
    count = last.count - (base.count if base else 0)
    total = last.sum_s - (base.sum_s if base else 0.0)
    return out + [(math.inf, float(count))], count, total


def scheduler_cost(ev: Evidence, wf: str = "scaling") -> list[Finding]:
    """What deciding costs against the request rate: the scheduler thread's CPU over the
    window (cores, and per decision) and each kind of scheduling call's p99 against the
    mean gap between two arriving requests. One thread makes every decision, so when it
    saturates, more engines or nodes add nothing: the remedy is hierarchical scheduling."""
    first, last = ev.samples[0].view, ev.samples[-1].view
    dt = ev.window_s
    s0, s1 = first.scheduler, last.scheduler
    if s1.cpu_s is None and not s1.decision_latency:
        return [Finding(wf, OK, "scheduler CPU and decision latency not available (the "
                        "server or recording does not report them)")]
    if dt <= 0:
        return [Finding(wf, OK, "scheduler cost not judged: one sample, no window")]
    decided = s1.decisions.total - s0.decisions.total
    arrived = max(0, decided + _queued(last) - _queued(first))
    rate = arrived / dt
    cores = _rate(s0.cpu_s, s1.cpu_s, dt)
    cpu_per = (cores * dt / decided if cores is not None and decided > 0 else None)
    p99: dict[str, float] = {}
    calls: dict[str, int] = {}
    wall = 0.0  # seconds the timed calls took in the window
    for kind, hist in sorted(s1.decision_latency.items()):
        buckets, count, took = _window_buckets(s0.decision_latency.get(kind), hist)
        calls[kind] = count
        wall += took
        q = histogram_quantile(0.99, buckets) if count >= DECISION_MIN_CALLS else None
        if q is not None:
            p99[kind] = q
    worst = max(p99, key=lambda k: p99[k]) if p99 else None
    load = p99[worst] * rate if worst is not None else None  # p99 over the arrival gap
    severity = OK
    if (cores is not None and cores >= SCHED_CPU_CRIT) or (
            load is not None and load >= DECISION_P99_CRIT):
        severity = CRITICAL
    elif (cores is not None and cores >= SCHED_CPU_WARN) or (
            load is not None and load >= DECISION_P99_WARN):
        severity = WARNING
    parts = [f"scheduler thread {'n/a' if cores is None else f'{cores:.2f}'} cores busy"]
    if cpu_per is not None:
        parts.append(f"{cpu_per * 1e3:.2f} ms CPU per decision at {decided / dt:.1f} "
                     f"decisions/s, {rate:.1f} requests/s")
    else:
        parts.append(f"{rate:.1f} requests/s, no decision in the window")
    if worst is not None and load is not None:
        gap = f"{1e3 / rate:.0f} ms" if rate > 0 else "no arrival"
        parts.append(f"decision p99 {p99[worst] * 1e3:.2f} ms ({worst}) = {load:.2f} of the "
                     f"{gap} between requests")
    else:
        parts.append(f"decision p99 not judged (< {DECISION_MIN_CALLS} timed calls of a kind)")
    evidence: dict[str, Any] = {
        "scheduler_cpu_cores": None if cores is None else round(cores, 4),
        "cpu_s_per_decision": None if cpu_per is None else round(cpu_per, 6),
        "decisions_per_s": round(decided / dt, 3), "requests_per_s": round(rate, 3),
        "decision_p99_s": {k: round(v, 6) for k, v in p99.items()},
        "decision_calls": calls,
        "decision_p99_over_arrival_gap": None if load is None else round(load, 4),
        "decision_wall_s": round(wall, 4)}
    if severity is OK:
        return [Finding(wf, OK, "; ".join(parts), evidence=evidence)]
    cpu_s = cores * dt if cores is not None else None
    if cpu_s is not None and wall > DECISION_WAIT_FACTOR * cpu_s:
        return [Finding(
            wf, severity, "; ".join(parts) + f" (the calls took {wall:.2f} s, the thread "
            f"ran {cpu_s:.2f} s: they waited for a CPU)", subject="scheduler",
            evidence=evidence,
            cause="the scheduler thread was starved: its calls took far longer than the CPU "
                  "it got, so it waited for a core (a loaded host, or the launcher's other "
                  "threads holding the GIL); a hierarchy would not help",
            action="free a core for the launcher: move other work off its host (uptime; top "
                   "-H -p <launcher pid> shows its threads), then dualpath diagnose scaling "
                   "again")]
    return [Finding(
        wf, severity, "; ".join(parts) + (" (the scheduler is the bottleneck)"
                                            if severity is CRITICAL else
                                            " (the scheduler is nearing its limit)"),
        subject="scheduler", evidence=evidence,
        cause="one scheduler thread makes every decision: near one core, or with calls "
              "as long as the gap between requests, requests wait for the scheduler and "
              "more engines or nodes add no throughput",
        action=_scale_scheduler(s1, last.pd))]


def role_busy(ev: Evidence) -> tuple[dict[str, float | None], int]:
    """Mean GPU busy per role over the window, and how many prefill-engine samples were read
    as busy because the engine was inside a batch longer than the window.

    An engine reports busy time when a batch ends, so while a prefill batch longer than the
    view's window runs its window reads idle (nothing finished) even though the GPU is
    computing: a slowed or overloaded PE reads idle for seconds at a time. A prefill engine
    that in a sample holds unfinished requests, has nothing left to load (its node's read
    queue is empty: not waiting on storage) and finished nothing in the window is inside
    such a batch, and counts as busy. Decode steps are one token long, so a decode engine
    holding requests and running nothing is waiting (on its prefills), not busy.
    """
    util = ev.engine_series("gpu_utilization")
    seq = ev.engine_series("seq")
    svc = ev.engine_series("service_time_s")
    rq = ev.engine_series("read_queue_tokens")
    out: dict[str, float | None] = {}
    in_batch = 0
    for role, ids in _role_engines(ev).items():
        vals: list[float] = []
        for eid in ids:
            for i, u in enumerate(util.get(eid, ())):
                if (role == "prefill" and (u is None or u < PD_BUSY_HIGH)
                        and svc[eid][i] is None and seq[eid][i] >= 1 and not rq[eid][i]):
                    u = 1.0
                    in_batch += 1
                if u is not None:
                    vals.append(float(u))
        out[role] = sum(vals) / len(vals) if vals else None
    return out, in_batch


# --- registry -----------------------------------------------------------------------------------
WORKFLOWS: dict[str, Callable[[Evidence], list[Finding]]] = {
    "snic-imbalance": snic_imbalance,
    "long-tail": long_tail,
    "hbm-frag": hbm_frag,
    "cache-hit": cache_hit,
    "scaling": scaling,
}
#: Other names a workflow answers to (the seed calls 6.1 "performance drop").
ALIASES = {"perf-drop": "snic-imbalance"}


def run_workflow(name: str, ev: Evidence, *, by_layer: bool = False) -> Report:
    """One workflow's :class:`Report` (``name`` may be an alias)."""
    canonical = ALIASES.get(name, name)
    rule = WORKFLOWS[canonical]
    # memoised: long-tail borrows hbm-frag's findings, so ``all`` computes them once
    findings = (cache_hit(ev, by_layer) if canonical == "cache-hit" else
                ev.memo(canonical, lambda: rule(ev)))
    findings = [f if f.workflow == canonical else dataclass_replace(f, workflow=canonical)
                for f in findings]
    findings.sort(key=lambda f: -int(f.severity))
    return Report(canonical, tuple(findings), ev.window_s, len(ev.samples), len(ev.decisions))


def run_all(ev: Evidence, *, by_layer: bool = False) -> list[Report]:
    """Every workflow (what cron runs); the worst severity is the exit code."""
    return [run_workflow(name, ev, by_layer=by_layer) for name in WORKFLOWS]
