"""A small, thread-safe, in-process registry that records the metrics of the table.

Recording must be cheap on hot paths (a loader completes tens of thousands of reads per
second), so callers bind labels once with :meth:`Family.labels` and keep the child; each
child update is one uncontended lock and an add. Names and label sets are checked against
:data:`~dualpath_cli.telemetry.metrics.METRICS`, so nothing outside the table is recorded.
"""

from __future__ import annotations

import bisect
import threading
from typing import Any

from dualpath_cli.telemetry.metrics import METRICS, MetricSpec, MetricType, spec

__all__ = ["MetricsRegistry", "Family", "Counter", "Gauge", "Histogram", "REGISTRY"]


class Counter:
    """A monotonically increasing value."""

    __slots__ = ("_lock", "value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        """Add ``amount`` (>= 0)."""
        if amount < 0:
            raise ValueError("a counter only goes up")
        with self._lock:
            self.value += amount


class Gauge:
    """A value that goes up and down."""

    __slots__ = ("_lock", "value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0.0

    def set(self, value: float) -> None:
        """Replace the value."""
        self.value = float(value)  # a single store is atomic under the GIL

    def add(self, amount: float) -> None:
        """Add ``amount`` (may be negative)."""
        with self._lock:
            self.value += amount


class Histogram:
    """Cumulative-bucket histogram with sum and count (Prometheus semantics)."""

    __slots__ = ("_lock", "bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._lock = threading.Lock()
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # last slot is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        """Record one observation."""
        slot = bisect.bisect_left(self.bounds, value)
        with self._lock:
            self.counts[slot] += 1
            self.sum += value
            self.count += 1

    def observe_many(self, values: list[float]) -> None:
        """Record a batch under one lock (for batched completions)."""
        slots = [bisect.bisect_left(self.bounds, v) for v in values]
        with self._lock:
            for slot in slots:
                self.counts[slot] += 1
            self.sum += sum(values)
            self.count += len(values)

    def cumulative(self) -> list[int]:
        """Counts per bucket, cumulative, ending with +Inf."""
        out, total = [], 0
        for c in self.counts:
            total += c
            out.append(total)
        return out


Child = Counter | Gauge | Histogram


class Family:
    """All children of one metric, keyed by label values."""

    def __init__(self, metric: MetricSpec, on_new: Any = None) -> None:
        self.spec = metric
        self._lock = threading.Lock()
        self._children: dict[tuple[str, ...], Child] = {}
        self._on_new = on_new  # called when a child is created (the registry's layout changed)

    def labels(self, **labels: object) -> Any:
        """The child for these label values (created on first use). Labels must match."""
        if set(labels) != set(self.spec.labels):
            raise ValueError(f"metric {self.spec.name}: labels {sorted(labels)} do not match "
                             f"the table's {list(self.spec.labels)}")
        key = tuple(str(labels[name]) for name in self.spec.labels)
        child = self._children.get(key)
        if child is None:
            with self._lock:
                child = self._children.get(key)
                if child is None:
                    child = self._new()
                    self._children[key] = child
                    if self._on_new is not None:
                        self._on_new()
        return child

    def _new(self) -> Child:
        if self.spec.type is MetricType.COUNTER:
            return Counter()
        if self.spec.type is MetricType.GAUGE:
            return Gauge()
        return Histogram(self.spec.buckets)

    def children(self) -> list[tuple[tuple[str, ...], Child]]:
        """(label values in table order, child) pairs, in creation order."""
        with self._lock:
            return list(self._children.items())

    def samples(self) -> list[tuple[dict[str, str], Child]]:
        """(labels, child) pairs, in creation order."""
        with self._lock:
            items = list(self._children.items())
        return [(dict(zip(self.spec.labels, key, strict=True)), child) for key, child in items]


class MetricsRegistry:
    """Families for every metric of the table, created lazily."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, Family] = {}
        #: Bumped whenever a family or a child is created: equal versions of one registry
        #: have the same series in the same order (telemetry/frames.py relies on it).
        self.layout_version = 0

    def _layout_changed(self) -> None:
        self.layout_version += 1

    def family(self, name: str) -> Family:
        """The family of ``name``; ``KeyError`` when the name is not in the table."""
        fam = self._families.get(name)
        if fam is None:
            metric = spec(name)
            with self._lock:
                fam = self._families.get(name)
                if fam is None:
                    fam = self._families[name] = Family(metric, self._layout_changed)
                    self._layout_changed()
        return fam

    def families(self) -> list[Family]:
        """The families recorded so far, in table order."""
        return [f for m in METRICS if (f := self._families.get(m.name)) is not None]

    def counter(self, name: str, **labels: object) -> Counter:
        """Bound counter child."""
        return self._typed(name, MetricType.COUNTER, labels)

    def gauge(self, name: str, **labels: object) -> Gauge:
        """Bound gauge child."""
        return self._typed(name, MetricType.GAUGE, labels)

    def histogram(self, name: str, **labels: object) -> Histogram:
        """Bound histogram child."""
        return self._typed(name, MetricType.HISTOGRAM, labels)

    def _typed(self, name: str, kind: MetricType, labels: dict[str, object]) -> Any:
        fam = self.family(name)
        if fam.spec.type is not kind:
            raise TypeError(f"metric {name} is a {fam.spec.type.value}, not a {kind.value}")
        return fam.labels(**labels)

    def value(self, name: str, **labels: object) -> float:
        """Current value of a counter or gauge child (0 when never recorded)."""
        fam = self.family(name)
        key = tuple(str(labels.get(n)) for n in fam.spec.labels)
        for sample_labels, child in fam.samples():
            if tuple(sample_labels[n] for n in fam.spec.labels) == key:
                if isinstance(child, Histogram):
                    return float(child.count)
                return child.value
        return 0.0

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        """Every recorded sample as plain data (for ``--json`` and the API)."""
        out: dict[str, list[dict[str, Any]]] = {}
        for metric in METRICS:
            fam = self._families.get(metric.name)
            if fam is None:
                continue
            rows: list[dict[str, Any]] = []
            for labels, child in fam.samples():
                if isinstance(child, Histogram):
                    rows.append({"labels": labels, "count": child.count, "sum": child.sum,
                                 "buckets": dict(zip([*map(str, child.bounds), "+Inf"],
                                                     child.cumulative(), strict=True))})
                else:
                    rows.append({"labels": labels, "value": child.value})
            out[metric.name] = rows
        return out


REGISTRY = MetricsRegistry()
"""The process-wide registry; components take a registry argument defaulting to it."""
