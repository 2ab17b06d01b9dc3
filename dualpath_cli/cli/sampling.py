"""How often the live commands (monitor, record, diagnose, top) sample a cluster.

Why its own module: the four commands share the rule, and none of them should import another
command's module for it.
"""

from __future__ import annotations

from dualpath_cli.errors import UsageError

__all__ = ["MIN_INTERVAL_S", "parse_interval"]

#: The shortest --interval: each sample is a full view of the cluster.
MIN_INTERVAL_S = 0.25


def parse_interval(text: str) -> float:
    """``--interval`` in seconds (units.py forms), refusing under :data:`MIN_INTERVAL_S`."""
    from dualpath_cli.units import parse_duration

    seconds = parse_duration(text)
    if seconds < MIN_INTERVAL_S:
        raise UsageError(f"--interval {text} is too short: the minimum is "
                         f"{MIN_INTERVAL_S * 1e3:.0f}ms (each sample is a full view of the "
                         "cluster)")
    return seconds
