"""6.3 Scaling: whether the cluster needs more nodes or another P/D split, and whether the
scheduler itself is the bottleneck (its thread's CPU and its decisions' latency).

A pure function over :class:`~dualpath_cli.diagnose.model.Evidence` (diagnose/rules.py
runs it); thresholds are diagnose/thresholds.py's.
"""

from __future__ import annotations

import math
from typing import Any

from dualpath_cli.diagnose.grading import (
    CRITICAL,
    OK,
    WARNING,
    histogram_quantile,
    mean_of,
    no_samples,
    pct,
    rate_of,
    role_engines,
)
from dualpath_cli.diagnose.model import Evidence, Finding, node_name
from dualpath_cli.diagnose.thresholds import (
    CNIC_MAX_AVG_WARN,
    DECISION_MIN_CALLS,
    DECISION_WAIT_FACTOR,
    ENGINE_HEADROOM_UTIL,
    FIFO_GROWTH_WARN,
    PD_BUSY_HIGH,
    PD_BUSY_LOW,
    PD_QUEUE_MIN,
    SNIC_BUSY_MIN,
)
from dualpath_cli.diagnose.verdict import RULES, Verdict, judge
from dualpath_cli.telemetry.view import SchedulerView

__all__ = ["scaling", "scheduler_cost", "role_busy"]


def scaling(ev: Evidence) -> list[Finding]:
    """Scheduler throughput against demand, the P/D balance of GPU busy, compute-NIC
    traffic per node (seed 6.3)."""
    wf = "scaling"
    if not ev.samples:
        return [no_samples(wf)]
    out: list[Finding] = []
    first, last = ev.samples[0].view.scheduler, ev.samples[-1].view.scheduler
    dt = ev.window_s
    rate = (last.decisions.total - first.decisions.total) / dt if dt > 0 else None
    growth = last.fifo_length - first.fifo_length
    util = ev.engine_series("gpu_utilization")
    all_util = mean_of([v for s in util.values() for v in s])
    headroom = all_util is not None and all_util < ENGINE_HEADROOM_UTIL
    if growth >= FIFO_GROWTH_WARN and headroom:
        out.append(Finding(
            wf, WARNING, f"scheduler FIFO grew by {growth} requests over {dt:.0f} s while "
            f"engines were {pct(all_util or 0)} busy ({rate or 0:.1f} decisions/s)",
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
        queue = mean_of([v for eid in role_engines(ev).get("prefill", ())
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
                wf, OK, f"{view.pd}: prefill GPUs {pct(p)} busy, decode {pct(d)}, but "
                f"{queue:.1f} requests per prefill engine (< {PD_QUEUE_MIN:g}): none wait "
                "for a prefill, so more prefill nodes would add no throughput",
                evidence={"pd": view.pd, "prefill_busy": p, "decode_busy": d,
                          "prefill_requests_per_engine": queue}))
        if shape:
            note = (f"; {in_batch} prefill-engine samples inside a batch longer than the "
                    "window" if in_batch else "")
            out.append(Finding(
                wf, WARNING, f"{view.pd}: prefill GPUs {pct(p)} busy, decode {pct(d)} "
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
                wf, OK, f"{view.pd}: prefill GPUs {pct(p)} busy, decode {pct(d)}: both "
                "sides loaded, no P/D bottleneck", evidence={"pd": view.pd,
                                                             "prefill_busy": p,
                                                             "decode_busy": d}))
    cutil = {n: mean_of(s) for n, s in ev.node_series("cnic_utilization").items()}
    known = {n: v for n, v in cutil.items() if v is not None}
    if len(known) >= 2:
        avg = sum(known.values()) / len(known)
        hot = max(known, key=lambda n: known[n])
        if avg >= SNIC_BUSY_MIN and known[hot] / avg >= CNIC_MAX_AVG_WARN:
            name = node_name(ev.nodes[hot])
            out.append(Finding(
                wf, WARNING, f"compute NICs Max/Avg {known[hot] / avg:.2f} (node {name} at "
                f"{pct(known[hot])})", subject=f"node {name}",
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


def _scale_scheduler(scheduler: SchedulerView, pd: str) -> str:
    """The remedy for a saturated scheduler: the hierarchy, or more subs when it is on."""
    on = "root_route" in scheduler.decision_latency
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
    cores = rate_of(s0.cpu_s, s1.cpu_s, dt)
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
    graded: dict[str, Verdict | None] = {}  # rule -> its verdict (None: too little evidence)
    if cores is not None:
        graded["scheduler-cpu"] = judge(RULES["scheduler-cpu"], cores, len(ev.samples),
                                        ev.previous, "scheduler", shown=f"{cores:.2f} cores")
    if load is not None and worst is not None:
        graded["decision-p99"] = judge(RULES["decision-p99"], load, calls[worst], ev.previous,
                                       "scheduler", shown=f"p99 {load:.2f} of the arrival gap")
    # the finding's grade is the worst of them
    verdicts = {name: v for name, v in graded.items() if v is not None}
    severity = max((v.severity for v in verdicts.values()), default=OK)
    why = "; ".join(v.why for v in verdicts.values()) or None
    rule_name = max(verdicts, key=lambda r: verdicts[r].severity) if verdicts else None
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
        "decision_wall_s": round(wall, 4),
        "rule_grades": {r: v.severity.name for r, v in verdicts.items()}}
    if severity is OK:
        return [Finding(wf, OK, "; ".join(parts), evidence=evidence, rule=rule_name, why=why)]
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
                   "again", rule=rule_name, why=why)]
    return [Finding(
        wf, severity, "; ".join(parts) + (" (the scheduler is the bottleneck)"
                                            if severity is CRITICAL else
                                            " (the scheduler is nearing its limit)"),
        subject="scheduler", evidence=evidence,
        cause="one scheduler thread makes every decision: near one core, or with calls "
              "as long as the gap between requests, requests wait for the scheduler and "
              "more engines or nodes add no throughput",
        action=_scale_scheduler(s1, last.pd), rule=rule_name, why=why)]


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
    for role, ids in role_engines(ev).items():
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
