"""A node's store reads as counted at earlier moments: rule store-latency's lookback.

Two counts are kept alike: the store's service time per read batch (what the rule grades
where the cluster reports it) and the blocks' read latency (what it grades where not).

Why: the scheduler steers reads away from a node whose store is slow, so a window may hold
fewer reads there than the rule's minimum, and the grade then follows how many reads
happened to land in it (issue 33). A slow store that is read less is still slow; what is
short is the evidence, not the fault. The latency histogram is cumulative (``(seconds
summed, reads)`` since the cluster started), so a count of it taken at an earlier moment,
subtracted from the window's last, gives the mean of every read since that moment: the
node's last N reads, however long they took to come, not only the reads of the last 30 s.

A :data:`Snapshot` is one such count, ``(at, seconds summed, reads)``. The diagnose CLI keeps
each node's counts from its previous runs on a cluster (cli/verdict_memory.py) and hands
them in as :attr:`Evidence.read_history`; the rule looks back at most
``STORE_LATENCY_LOOKBACK_S`` and says how far it went. Pure functions, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dualpath_cli.telemetry.recording import Extras, Sample

__all__ = ["Snapshot", "Lookback", "snapshots", "merged", "last_reads", "KEEP"]

#: ``(at, latency seconds summed, reads)``: one node's cumulative store-read count.
Snapshot = tuple[float, float, int]
#: Snapshots kept per node (those with a new read count; the newest at each count).
KEEP = 64


@dataclass(frozen=True, slots=True)
class Lookback:
    """The node's last reads, back to an earlier snapshot."""

    mean_s: float  # their mean latency
    reads: int  # how many (at least the rule's minimum)
    since: float  # the snapshot's time: they came after it
    span_s: float  # from it to the window's end


def _latency(x: Extras) -> Mapping[int, tuple[float, int]]:
    return x.store_read_latency


def snapshots(samples: Sequence[Sample],
              counts: Callable[[Extras], Mapping[int, tuple[float, int]]] = _latency
              ) -> dict[int, list[Snapshot]]:
    """Each node's cumulative counts in ``samples`` (``counts`` picks which: the read
    latency by default), oldest first, one per read count (the newest moment with that
    count: the shortest span back to it)."""
    out: dict[int, dict[int, Snapshot]] = {}
    for s in samples:
        for node, (total, count) in counts(s.extras).items():
            out.setdefault(node, {})[int(count)] = (float(s.at), float(total), int(count))
    return {n: sorted(by.values())[-KEEP:] for n, by in out.items()}


def merged(old: Mapping[int, Sequence[Snapshot]], new: Mapping[int, Sequence[Snapshot]],
           end: float, lookback_s: float) -> dict[int, list[Snapshot]]:
    """``old`` and ``new`` together, one per read count (the newest), none older than
    ``lookback_s`` before ``end`` and none counting more reads than the newest (a cluster
    started again counts from zero: its earlier counts say nothing about it); at most
    :data:`KEEP` a node, the newest (they span at least KEEP - 1 reads, more than the
    rule's minimum, so the newest count that leaves the minimum is among them)."""
    out: dict[int, list[Snapshot]] = {}
    for node in set(old) | set(new):
        both = [(float(at), float(t), int(c)) for at, t, c in
                (*old.get(node, ()), *new.get(node, ()))]
        if not both:
            continue
        newest = max(both)[2]
        by_count: dict[int, Snapshot] = {}
        for snap in sorted(both):
            if snap[0] >= end - lookback_s and snap[2] <= newest:
                by_count[snap[2]] = snap  # the newest moment with this count
        if by_count:
            out[node] = sorted(by_count.values())[-KEEP:]
    return out


def last_reads(history: Sequence[Snapshot], start: float, end: float,
               now: tuple[float, int], minimum: int, lookback_s: float) -> Lookback | None:
    """The node's last reads at the window's end (cumulative ``now``: seconds summed,
    reads) back to the newest snapshot before the window ``start`` that leaves at least
    ``minimum`` reads, no older than ``lookback_s`` before ``end`` (None: no such one)."""
    total, count = now
    fit = [s for s in history if end - lookback_s <= s[0] < start
           and s[2] <= count - minimum and s[1] <= total]
    if not fit:
        return None
    at, t0, c0 = max(fit)
    reads = count - c0
    return Lookback(max(0.0, total - t0) / reads, reads, at, end - at)
