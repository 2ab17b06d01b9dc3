"""The helpers the troubleshooting workflows share: series in, a number or a finding out.

Why: every workflow grades a window the same way (a mean or a share of the samples that
report a value, a rate between the first and the last sample, a histogram's quantile), and
words the same "no samples" finding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from dualpath_cli.diagnose.model import Evidence, Finding, Severity

__all__ = ["OK", "WARNING", "CRITICAL", "UNKNOWN", "values_of", "mean_of", "share_of", "pct",
           "tok_text", "rate_of", "role_nodes", "role_engines", "no_samples",
           "histogram_quantile", "dataclass_replace"]


OK, WARNING, CRITICAL, UNKNOWN = (Severity.OK, Severity.WARNING, Severity.CRITICAL,
                                  Severity.UNKNOWN)


def values_of(series: Sequence[Any]) -> list[float]:
    """The values a series reports (``None``: not reported, left out)."""
    return [float(v) for v in series if v is not None]


def mean_of(series: Sequence[Any]) -> float | None:
    """The mean of the reported values (``None`` when none is)."""
    vals = values_of(series)
    return sum(vals) / len(vals) if vals else None


def share_of(series: Sequence[Any], pred: Callable[[float], bool]) -> float:
    """The share of the reported values for which ``pred`` holds (0 when none is)."""
    vals = values_of(series)
    return sum(1 for v in vals if pred(v)) / len(vals) if vals else 0.0


def pct(x: float) -> str:
    """A share as a whole percentage."""
    return f"{x * 100:.0f}%"


def tok_text(n: float) -> str:
    """Tokens as the CLI prints them (``200K``)."""
    from dualpath_cli.units import format_tokens

    return format_tokens(n)


def rate_of(first: Any, last: Any, dt: float) -> float | None:
    """A counter's rate from ``first`` to ``last`` over ``dt`` seconds (``None``: unknown)."""
    if first is None or last is None or dt <= 0:
        return None
    return max(0.0, (float(last) - float(first)) / dt)


def role_nodes(ev: Evidence) -> dict[str, list[int]]:
    """Role -> the nodes that have it."""
    out: dict[str, list[int]] = {}
    for n in ev.nodes.values():
        out.setdefault(n.role, []).append(n.node)
    return out


def role_engines(ev: Evidence) -> dict[str, list[int]]:
    """Role -> the engines that have it."""
    out: dict[str, list[int]] = {}
    for e in ev.engines.values():
        out.setdefault(e.role, []).append(e.engine_id)
    return out


def no_samples(workflow: str) -> Finding:
    """The finding of a window without a sample (severity UNKNOWN)."""
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


def dataclass_replace(f: Finding, **kw: Any) -> Finding:
    """``f`` with fields changed (a finding borrowed by another workflow)."""
    import dataclasses

    return dataclasses.replace(f, **kw)
