"""``de-first``: a read-path policy a plugin adds to the one policy table.

Why here: it shows (and the tests prove) that a policy registered through the
``dualpath_register_policies`` hook is run by the runtime and the simulator like a built-in
one. The rule keeps the PE's storage NIC free for the prefill's own misses: read on the DE
side while the DE node's read queue is within alpha, else on the PE side.
"""

from __future__ import annotations

from dualpath_cli.core.policies import Policy, ReadPlan, SchedParams
from dualpath_cli.core.types import EngineSnapshot, ReadSide, Request

__all__ = ["DE_FIRST", "plan_de_first"]


def plan_de_first(request: Request, pe: EngineSnapshot, de: EngineSnapshot,
                  params: SchedParams, ordinal: int) -> ReadPlan:
    """DE side while the DE node's read queue is at most alpha, else PE side."""
    if de.read_q <= params.alpha:
        return ReadPlan(ReadSide.DE, 0, request.cached)
    return ReadPlan(ReadSide.PE, request.cached, 0)


DE_FIRST = Policy("de-first", "read on the DE side while its read queue is within alpha "
                  "(plugin dualpath-pd-sweep)", plan_de_first)
