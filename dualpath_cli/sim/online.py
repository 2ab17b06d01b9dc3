"""Online serving: a run at a given arrival rate, the SLO, the steady-state rule, capacity.

The paper (section 7.2): agents arrive as a Poisson process (APS); the SLO is TTFT <= 4 s and
TPOT <= 50 ms; a run stops when TTFT exceeds 4 s or at steady state, when the TTFT over a
150 s window stays within 5% of its value 30 minutes earlier. The capacity is the highest APS
whose run meets the SLO, found here by bisection over APS.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

from dualpath_cli.errors import UsageError
from dualpath_cli.sim.metrics import SimResult

__all__ = ["SLO", "StopRule", "meets_slo", "CapacityResult", "check_aps_range",
           "check_online", "find_capacity"]


@dataclass(frozen=True, slots=True)
class SLO:
    """Service-level objective on mean latencies (paper: 4 s TTFT, 50 ms TPOT)."""

    ttft_s: float = 4.0
    tpot_s: float = 0.050


def meets_slo(result: SimResult, slo: SLO | None = None) -> bool:
    """Whether an online run met the SLO.

    The run must not have been stopped by :class:`StopRule` for TTFT, mean TTFT and TPOT
    over the measured turns must be within the SLO, and no turn still waiting at the end
    may be older than the TTFT bound (a growing backlog is a miss even if the turns that did
    finish were fast).
    """
    slo = slo or SLO()
    if result.stop_reason == "ttft":  # the run ended because a window broke the bound
        return False
    if result.ttft is None or result.tpot is None or result.ttft.count == 0:
        return False
    if result.extra.get("oldest_waiting_s", 0.0) > slo.ttft_s:
        return False
    tpot_ok = math.isnan(result.tpot.mean) or result.tpot.mean <= slo.tpot_s
    return result.ttft.mean <= slo.ttft_s and tpot_ok


class StopRule:
    """The paper's end of an online run, checked while it runs (section 7.2).

    A run stops when the mean TTFT of the last ``window`` seconds exceeds the SLO's bound
    (``"ttft"``: the rate is over capacity), or at steady state (``"steady"``): that mean is
    within ``tolerance`` of the same window's mean ``lookback`` seconds earlier. TTFTs are
    added in the order they are observed, so a check is two bisections over running sums.
    """

    def __init__(self, ttft_bound: float = 4.0, window: float = 150.0,
                 lookback: float = 1800.0, tolerance: float = 0.05) -> None:
        self.ttft_bound = ttft_bound
        self.window = window
        self.lookback = lookback
        self.tolerance = tolerance
        self.times: list[float] = []
        self.sums: list[float] = [0.0]  # sums[i] = total of the first i TTFTs

    def add(self, when: float, ttft: float) -> None:
        """A TTFT observed at ``when`` (not earlier than the previous one's)."""
        self.times.append(when)
        self.sums.append(self.sums[-1] + ttft)

    def mean(self, lo: float, hi: float) -> float:
        """Mean TTFT observed in ``[lo, hi)``; NaN when none was."""
        i, j = bisect_left(self.times, lo), bisect_left(self.times, hi)
        return (self.sums[j] - self.sums[i]) / (j - i) if j > i else math.nan

    def verdict(self, now: float) -> str | None:
        """``"ttft"``, ``"steady"`` or ``None`` (go on) at time ``now``."""
        if now < self.window:
            return None
        recent = self.mean(now - self.window, now)
        if math.isnan(recent):
            return None
        if recent > self.ttft_bound:
            return "ttft"
        past = self.mean(now - self.lookback - self.window, now - self.lookback)
        if not math.isnan(past) and past > 0 and abs(recent - past) <= self.tolerance * past:
            return "steady"
        return None


@dataclass(frozen=True, slots=True)
class CapacityResult:
    """Highest APS meeting the SLO, and every probe made on the way."""

    aps: float
    probes: tuple[tuple[float, bool, float, float], ...]  # (aps, ok, ttft mean, tpot mean)

    def to_dict(self) -> dict[str, object]:
        """Plain dict."""
        return {"capacity_aps": self.aps,
                "probes": [{"aps": a, "ok": ok, "ttft_mean_s": f, "tpot_mean_s": p}
                           for a, ok, f, p in self.probes]}


def check_online(aps: float, horizon: float) -> None:
    """An online run's rate and length must be finite numbers > 0 (UsageError if not).

    Callers that size a workload from them check before building it.
    """
    if not aps > 0 or not math.isfinite(aps):
        raise UsageError(f"arrival rate must be a finite number > 0 agents/s, got {aps}")
    if not horizon > 0 or not math.isfinite(horizon):
        raise UsageError(f"horizon must be a finite number > 0 s, got {horizon}")


def check_aps_range(lo: float, hi: float) -> None:
    """A capacity search's range must be finite with ``0 < lo < hi`` (UsageError if not)."""
    if not 0 < lo < hi < math.inf:
        raise UsageError(f"capacity search needs 0 < lo < hi (finite), got lo={lo}, hi={hi}")


def find_capacity(run_at: Callable[[float], SimResult], lo: float, hi: float,
                  slo: SLO | None = None, steps: int = 7) -> CapacityResult:
    """Bisect APS in ``[lo, hi]`` for the highest rate whose run meets ``slo``.

    ``run_at(aps)`` runs one online simulation. If ``hi`` meets the SLO it is returned (widen
    the range); if ``lo`` fails, the capacity is reported as 0.
    """
    check_aps_range(lo, hi)
    if steps < 0:
        raise UsageError(f"capacity search needs steps >= 0, got {steps}")
    probes: list[tuple[float, bool, float, float]] = []

    def probe(aps: float) -> bool:
        res = run_at(aps)
        ok = meets_slo(res, slo)
        probes.append((aps, ok, res.ttft.mean if res.ttft else math.nan,
                       res.tpot.mean if res.tpot else math.nan))
        return ok

    if probe(hi):
        return CapacityResult(hi, tuple(probes))
    if not probe(lo):
        return CapacityResult(0.0, tuple(probes))
    good, bad = lo, hi
    for _ in range(steps):
        mid = (good + bad) / 2
        if probe(mid):
            good = mid
        else:
            bad = mid
    return CapacityResult(good, tuple(probes))
