"""Hierarchical scheduling (paper 6.3, 8.1): a root routes turns to sub-schedulers.

Why: one scheduler's fetches scan every group (the DE drain weighs every group's load), so
its decision time grows with the cluster. Split the groups into ``subs`` sub-schedulers,
each owning a contiguous slice of the prefill groups and of the decode groups; the root
only picks a sub for each new turn, with the *same* phase-1 rule the DE drain uses for
groups (:func:`~dualpath_cli.core.de_schedule.de_route`: the least-loaded target, in FIFO
order), and each sub then runs the flat algorithms (PE fetch, DE route, DE place) over its
own groups. Pure: no clocks, no state beyond the arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dualpath_cli.core.de_schedule import RouteResult, de_route
from dualpath_cli.core.types import Request
from dualpath_cli.errors import UsageError

__all__ = ["partition", "route_to_subs", "check_subs", "default_subs", "GROUPS_PER_SUB"]


def check_subs(subs: int, prefill_groups: int, decode_groups: int) -> int:
    """``subs`` if every sub gets at least one prefill and one decode group.

    Raises:
        UsageError: fewer than 1, or more than either role's group count.
    """
    most = min(prefill_groups, decode_groups)
    if not 1 <= subs <= most:
        raise UsageError(f"sub-schedulers {subs}: need 1 to {most} (each owns at least one "
                         f"prefill and one decode group of {prefill_groups}P{decode_groups}D)")
    return subs


def partition(ids: Sequence[int], parts: int) -> list[tuple[int, ...]]:
    """``ids`` split in order into ``parts`` contiguous slices whose sizes differ by <= 1."""
    if parts < 1:
        raise UsageError(f"parts {parts}: need at least 1")
    n = len(ids)
    out = []
    for k in range(parts):
        out.append(tuple(ids[k * n // parts:(k + 1) * n // parts]))
    return out


def route_to_subs(requests: Sequence[Request], sub_loads: Mapping[int, int]) -> RouteResult:
    """Root decision: each request to the least-loaded sub-scheduler (tokens it holds).

    The same function that routes a DE drain to groups, one level up.
    """
    return de_route(requests, sub_loads)


#: Prefill groups one sub-scheduler owns by default (with twice as many decode groups at
#: the paper's 1:2 ratio): 48P96D has 12 subs, 480P960D 120.
GROUPS_PER_SUB = 4


def default_subs(prefill_groups: int, decode_groups: int) -> int:
    """How many sub-schedulers ``scheduler.hierarchical`` uses for a P/D shape."""
    return max(1, min(prefill_groups, decode_groups) // GROUPS_PER_SUB)
