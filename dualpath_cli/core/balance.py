"""Load balance as the paper measures it: Max/Avg of a quantity across NICs or GPUs.

1.0 means perfectly balanced; the paper reports storage-NIC Max/Avg 1.53 (round robin) vs
1.18 (DualPath). One definition, used by the runtime bench and the simulator alike.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["max_over_avg"]


def max_over_avg(values: Sequence[float]) -> float:
    """``max(values) / mean(values)``; NaN when there are no values or they sum to zero."""
    total = sum(values)
    if not values or total <= 0:
        return float("nan")
    return max(values) / (total / len(values))
