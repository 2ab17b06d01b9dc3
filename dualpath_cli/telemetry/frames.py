"""Metrics frames: an engine's registry as a layout and a flat list of numbers, and the
merge of many frames that ``/metrics`` renders.

Why: a 48P96D x 8 cluster has 1,152 engines, and every one reports its node's storage
families under the same labels as its seven neighbours, so a scrape adds up ~25K samples.
Merged as ``{"labels": {...}, "value": ...}`` rows, that cost ~1 us of Python per row and
per (engine, family) pair (80 ms a page on this machine; the goal is 50 ms). A frame keeps
what changes between heartbeats (the values) apart from what does not (which series they
are): the merger maps each engine's layout to positions once, and every later scrape adds
all engines' values with one ``numpy.bincount``.

A frame (plain data, what a heartbeat carries through msgpack)::

    {"lid": "<pid>:<registry>:<version>",     # equal lids: equal layouts
     "layout": [[family, [label values in table order], slots], ...],
     "values": [float, ...]}                  # the slots of every series, in layout order

A counter or gauge has one slot; a histogram has one per bucket (cumulative, ``+Inf``
last), then its sum, then its count. :func:`expand_frame` turns a frame back into the
``MetricsRegistry.snapshot()`` rows the rest of the package reads.

Merge rules (as for snapshot rows): counters, histograms and gauges add up, except ratio
gauges (mean over the engines that report them) and :data:`MAX_MERGED` gauges (one shared
thing every engine reports: maximum). A value that is not available (NaN) is left out.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dualpath_cli.telemetry.metrics import METRICS, MetricType
from dualpath_cli.telemetry.registry import Histogram, MetricsRegistry

__all__ = ["MAX_MERGED", "FrameMerger", "MergedFrames", "expand_frame", "frame", "is_frame"]

LabelKey = tuple[str, ...]

_SPECS = {m.name: m for m in METRICS}
#: Gauges of one shared thing that every engine reports (merged by maximum, not summed).
MAX_MERGED = frozenset({"dualpath_storage_shaped_bandwidth_bytes_per_second"})
_LES = {m.name: [*map(str, m.buckets), "+Inf"] for m in METRICS
        if m.type is MetricType.HISTOGRAM}


def _slots(name: str) -> int:
    les = _LES.get(name)
    return 1 if les is None else len(les) + 2


def frame(registry: MetricsRegistry) -> dict[str, Any]:
    """``registry`` as a frame (module docstring)."""
    lid = f"{os.getpid()}:{id(registry)}:{registry.layout_version}"
    layout: list[list[Any]] = []
    values: list[float] = []
    for fam in registry.families():
        name = fam.spec.name
        for key, child in fam.children():
            if isinstance(child, Histogram):
                layout.append([name, list(key), len(child.counts) + 2])
                values.extend(map(float, child.cumulative()))
                values.append(float(child.sum))
                values.append(float(child.count))
            else:
                layout.append([name, list(key), 1])
                values.append(float(child.value))
    return {"lid": lid, "layout": layout, "values": values}


def is_frame(metrics: Any) -> bool:
    """Whether ``metrics`` is a frame (else: snapshot rows, or nothing)."""
    return isinstance(metrics, Mapping) and "layout" in metrics and "values" in metrics


def expand_frame(fr: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The frame as ``MetricsRegistry.snapshot()`` rows (families in table order)."""
    out: dict[str, list[dict[str, Any]]] = {}
    values = fr["values"]
    pos = 0
    for name, key, slots in fr["layout"]:
        spec = _SPECS.get(name)
        chunk = values[pos:pos + slots]
        pos += slots
        if spec is None:
            continue
        labels = dict(zip(spec.labels, map(str, key), strict=True))
        if spec.type is MetricType.HISTOGRAM:
            les = _LES[name]
            if slots != len(les) + 2:
                continue  # another bucket layout: not this table's
            out.setdefault(name, []).append(
                {"labels": labels, "count": int(chunk[-1]), "sum": chunk[-2],
                 "buckets": dict(zip(les, map(int, chunk[:-2]), strict=True))})
        else:
            out.setdefault(name, []).append({"labels": labels, "value": chunk[0]})
    return {m.name: out[m.name] for m in METRICS if m.name in out}


@dataclass
class MergedFrames:
    """Merged series: ``scalars[family][key]`` and ``hists[family][key] = (les, cumulative
    counts, sum, count)``."""

    scalars: dict[str, dict[LabelKey, float]] = field(default_factory=dict)
    hists: dict[str, dict[LabelKey, tuple[list[str], list[float], float, float]]] = field(
        default_factory=dict)


class FrameMerger:
    """Merges frames scrape after scrape, remembering where each layout's values go.

    ``max_series`` bounds what it remembers: past it (engines come and go with new ids),
    it starts over.
    """

    def __init__(self, max_series: int = 2_000_000) -> None:
        self.max_series = max_series
        self._reset()

    def _reset(self) -> None:
        self._start: dict[tuple[str, LabelKey], int] = {}  # series -> first position
        self._series: list[tuple[str, LabelKey, int, int]] = []  # (family, key, start, slots)
        self._by_family: dict[str, list[int]] = {}  # family -> indices into _series
        self._size = 0
        self._engines: dict[Any, tuple[str, np.ndarray]] = {}  # engine -> (lid, positions)
        self._joined: tuple[tuple[Any, ...], np.ndarray] | None = None

    def _positions(self, engine: Any, fr: Mapping[str, Any]) -> np.ndarray:
        """Where each value of ``engine``'s frame goes (-1: dropped), cached by its lid."""
        lid = fr["lid"]
        got = self._engines.get(engine)
        if got is not None and got[0] == lid:
            return got[1]
        out: list[int] = []
        for name, key, slots in fr["layout"]:
            skey = (name, tuple(map(str, key)))
            start = self._start.get(skey)
            if start is None:
                if name not in _SPECS or slots != _slots(name):
                    out.extend([-1] * slots)  # not in the table, or another bucket layout
                    continue
                start = self._start[skey] = self._size
                self._by_family.setdefault(name, []).append(len(self._series))
                self._series.append((name, skey[1], start, slots))
                self._size += slots
            elif slots != _slots(name):
                out.extend([-1] * slots)
                continue
            out.extend(range(start, start + slots))
        positions = np.asarray(out, dtype=np.intp)
        self._engines[engine] = (lid, positions)
        return positions

    def merge(self, frames: Mapping[Any, Mapping[str, Any]],
              skip: frozenset[str] = frozenset()) -> MergedFrames:
        """Every frame's series merged (families in ``skip`` left out of the result)."""
        if len(self._series) > self.max_series:
            self._reset()
        ids: list[tuple[Any, str]] = []
        parts: list[np.ndarray] = []
        value_lists: list[list[float]] = []
        for engine, fr in frames.items():
            if not is_frame(fr):
                continue
            positions = self._positions(engine, fr)
            if len(fr["values"]) != len(positions):
                continue  # a frame whose values do not fit its layout: left out
            ids.append((engine, fr["lid"]))
            parts.append(positions)
            value_lists.append(fr["values"])
        signature = tuple(ids)
        if self._joined is not None and self._joined[0] == signature:
            idx = self._joined[1]
        else:
            idx = np.concatenate(parts) if parts else np.empty(0, dtype=np.intp)
            self._joined = (signature, idx)
        vals = np.fromiter(itertools.chain.from_iterable(value_lists), dtype=float,
                           count=len(idx))
        ok = (idx >= 0) & ~np.isnan(vals)
        at, vals = idx[ok], vals[ok]
        size = self._size
        total_arr = np.bincount(at, weights=vals, minlength=size)
        # plain lists: indexing a numpy array one element at a time costs 5x a list's
        total: list[float] = total_arr.tolist()
        count: list[int] = np.bincount(at, minlength=size).tolist()
        out = MergedFrames()
        for name, series in self._by_family.items():
            if name in skip:
                continue
            spec = _SPECS[name]
            if spec.type is MetricType.HISTOGRAM:
                hists: dict[LabelKey, tuple[list[str], list[float], float, float]] = {}
                les = _LES[name]
                for i in series:
                    _, key, start, slots = self._series[i]
                    if count[start]:
                        cells = total[start:start + slots]
                        hists[key] = (les, cells[:-2], cells[-2], cells[-1])
                if hists:
                    out.hists[name] = hists
                continue
            fam: dict[LabelKey, float] = {}
            if name in MAX_MERGED:
                picked = [self._series[i] for i in series]
                sel = np.isin(at, [start for _, _, start, _ in picked])
                best = np.full(size, -np.inf)
                np.maximum.at(best, at[sel], vals[sel])
                for _, key, start, _ in picked:
                    if count[start]:
                        fam[key] = float(best[start])
            else:
                mean = spec.unit == "ratio"  # ratio gauges: the mean over engines
                for i in series:
                    _, key, start, _ = self._series[i]
                    n = count[start]
                    if n:
                        fam[key] = total[start] / n if mean else total[start]
            if fam:
                out.scalars[name] = fam
        return out
