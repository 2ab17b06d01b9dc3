"""Rule store-latency: how long a node's store takes, per node, worst first (snic-imbalance
runs it).

Why its own rule: a slow store read on a node (a slow disk or store target behind it) does
not slow its link, so snic-link cannot see it; and the node's reads are not only
prefills' (kv-wait): a decode node's loader reads for the reads the scheduler sends to the
decode side.

What it grades: the store's **service time** (``dualpath_storage_read_service_seconds``:
per read batch, from when a reader started the batch's I/O to when the store returned
it), not a block's read latency (``dualpath_storage_read_latency_seconds``: from queued to
delivered). A block's latency adds its wait behind the reads queued before it, and that
queue grows with the load (the agents' contexts grow turn by turn, so more blocks wait
behind each slow batch): under one steady slow store the mean latency climbed from 0.4 s to
2.5 s in a run and crossed CRITICAL (issue 33), while the store's own time stayed what the
fault added. Recordings and clusters that do not report service time are graded on the
read latency as before, and the finding says which it graded; the window's mean read
latency (queue included) is in the evidence either way.

Where the window holds fewer than the minimum (the scheduler steers reads away from a slow
store), the node's last reads are graded instead, counted back to a moment an earlier
diagnose run counted (at most STORE_LATENCY_LOOKBACK_S before; diagnose/read_history.py),
and the finding says how far back it went.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dualpath_cli.diagnose.model import Evidence, Finding, Severity, node_name
from dualpath_cli.diagnose.read_history import Lookback, Snapshot, last_reads
from dualpath_cli.diagnose.thresholds import STORE_LATENCY_LOOKBACK_S
from dualpath_cli.diagnose.verdict import RULES, judge, not_enough
from dualpath_cli.telemetry.recording import Extras

__all__ = ["store_latency", "window_means", "service_of", "latency_of"]

#: A node's cumulative ``(seconds summed, count)`` in one sample's extras.
Counts = Callable[[Extras], Mapping[int, tuple[float, int]]]


def service_of(x: Extras) -> Mapping[int, tuple[float, int]]:
    """The store's service time by node: ``(seconds summed, read batches)``."""
    return x.store_read_service


def latency_of(x: Extras) -> Mapping[int, tuple[float, int]]:
    """The blocks' read latency (queue wait included) by node: ``(seconds summed, reads)``."""
    return x.store_read_latency


@dataclass(frozen=True)
class _Measure:
    """What the rule grades in this window: service time, or read latency where the
    cluster or the recording does not report service time."""

    counts: Counts
    history: Mapping[int, Sequence[Snapshot]]
    unit: str  # what one count is, in the finding's words
    what: str  # the graded value, in the finding's words
    metric: str  # the metric to look at


_SERVICE = ("read batches", "store service time per read batch",
            "dualpath_storage_read_service_seconds")
_LATENCY = ("reads", "read latency (queued to delivered; service time not reported)",
            "dualpath_storage_read_latency_seconds")


def _measure(ev: Evidence) -> _Measure:
    if ev.samples[-1].extras.store_read_service:
        return _Measure(service_of, ev.service_history, *_SERVICE)
    return _Measure(latency_of, ev.read_history, *_LATENCY)


def window_means(ev: Evidence, counts: Counts) -> dict[int, tuple[float, int]]:
    """Each node's ``(mean seconds, count)`` in the window: the histogram's sum and count,
    last sample less first (one sample: since start)."""
    x0, x1 = ev.samples[0].extras, ev.samples[-1].extras
    out = {}
    for n, (total, count) in counts(x1).items():
        s0, c0 = counts(x0).get(n, (0.0, 0)) if len(ev.samples) > 1 else (0.0, 0)
        done = count - c0
        if done > 0:
            out[n] = (max(0.0, total - s0) / done, done)
    return out


def store_latency(ev: Evidence) -> list[Finding]:
    """Each node's mean store service time (read latency where that is not reported) over
    the window, or its last reads back to an earlier count, graded; worst first."""
    rule = RULES["store-latency"]
    m = _measure(ev)
    out = []
    window = window_means(ev, m.counts)
    latency = window_means(ev, latency_of)
    nodes = ev.nodes
    start, end = ev.samples[0].at, ev.samples[-1].at
    now = m.counts(ev.samples[-1].extras)
    graded: dict[int, tuple[float, int, Lookback | None]] = {}
    for n in set(window) | (set(m.history) & set(now)):
        mean, count = window.get(n, (0.0, 0))
        back = None
        if count < rule.minimum and n in now:
            back = last_reads(m.history.get(n, ()), start, end, now[n], rule.minimum,
                              STORE_LATENCY_LOOKBACK_S)
        if back is not None:
            graded[n] = (back.mean_s, back.reads, back)
        elif count:
            graded[n] = (mean, count, None)
    for n, (mean, count, back) in sorted(graded.items(), key=lambda kv: -kv[1][0]):
        if n not in nodes:
            continue
        subject = f"node {node_name(nodes[n])}"
        v = judge(rule, mean, count, ev.previous, subject,
                  shown=f"{mean * 1e3:.0f} ms mean {m.what}")
        if v is None:
            if mean >= rule.warn:
                out.append(not_enough(rule, count, f"{subject} store {m.unit}", subject))
            continue
        if v.severity:
            out.append(_finding(ev, m, n, mean, count, back, window, latency, v.severity,
                                v.why))
    return out


def _finding(ev: Evidence, m: _Measure, n: int, mean: float, count: int,
             back: Lookback | None, window: Mapping[int, tuple[float, int]],
             latency: Mapping[int, tuple[float, int]], severity: Severity,
             why: str) -> Finding:
    """The graded node's finding: its value, what it counted, its peers and its queue."""
    rule = RULES["store-latency"]
    nodes = ev.nodes
    name = node_name(nodes[n])
    service = m.counts is service_of
    in_window = window.get(n, (0.0, 0))[1]
    counted = f"{count} {m.unit} in {ev.window_s:.0f} s"
    if back is not None:
        why += (f"; the window had {in_window} {m.unit} (< {rule.minimum}): graded on the "
                f"node's last {count} {m.unit}, back {back.span_s:.0f} s (at most "
                f"{STORE_LATENCY_LOOKBACK_S:g} s) to a count an earlier diagnose run took")
        counted = (f"its last {count} {m.unit}, over {back.span_s:.0f} s; {in_window} in "
                   f"this {ev.window_s:.0f} s window")
    others = {node_name(nodes[k]): r[0] for k, r in window.items() if k != n and k in nodes}
    peers = ", ".join(f"{k} {ms * 1e3:.0f} ms" for k, ms in sorted(others.items()))
    peers = f"; the other nodes' {peers}" if peers else ""
    lat = latency.get(n)
    evidence: dict[str, object] = {
        "node": name, "graded": "service_time" if service else "read_latency",
        "lookback_s": round(back.span_s, 3) if back is not None else 0.0}
    if service:
        title = (f"node {name} store takes {mean * 1e3:.0f} ms per read batch on average "
                 f"({counted}){peers}")
        if lat is not None:
            title += (f"; with the wait in its read queue a block read takes "
                      f"{lat[0] * 1e3:.0f} ms")
        evidence.update({
            "mean_service_s": round(mean, 6), "read_batches": count,
            "read_batches_in_window": in_window,
            "peers_service_s": {k: round(s, 6) for k, s in others.items()},
            "mean_read_latency_s": round(lat[0], 6) if lat is not None else None,
            "reads_in_window": lat[1] if lat is not None else 0})
    else:
        title = (f"node {name} store reads take {mean * 1e3:.0f} ms on average ({counted})"
                 f"{peers}; read latency, queue wait included (this cluster or recording "
                 "does not report the store's service time)")
        evidence.update({
            "mean_read_latency_s": round(mean, 6), "reads": count,
            "reads_in_window": in_window,
            "peers_read_latency_s": {k: round(s, 6) for k, s in others.items()}})
    return Finding(
        "snic-imbalance", severity, title, subject=f"node {name}",
        evidence=evidence,
        cause=f"slow store reads on {name} (its disk or store target, the path to it; "
              "its storage NIC's rate is graded by snic-link): every turn that reads "
              f"its cached prefix through {name} waits for them"
              + ("; the scheduler sends it few reads now (few in the window)"
                 if back is not None else ""),
        action=f"check the store behind {name}: dualpath storage bench --root <store> "
               f"(run on {name}); dmesg; the metric {m.metric} by node",
        rule=rule.name, why=why)
