"""Threshold maths: alpha and beta by the seed's rule and by the paper's rule.

* Seed rule: alpha = storage-NIC bandwidth x expected latency (a bandwidth-delay product, in
  bytes). Note that 400 Gbps x 50 us is 2.5 MB, not the 8 KB the seed quotes.
* Paper rule: alpha = tokens the node's storage NIC reads in a window (3 s); beta = tokens one
  GPU processes in a window (5 s).
The scheduler compares both in tokens, so bytes are converted with the model's KV bytes per
token (all layers).

Dynamic controllers (pure: current value and a utilisation in, next value out):

* :func:`dynamic_alpha`, the seed's rule: x0.9 above 80% storage-NIC utilisation (a busy NIC
  should be offered fewer reads), x1.1 below 50%, unchanged between; clamped to [lo, hi]. The
  seed multiplies a fixed base each time (so it only ever yields base x0.9, base, base x1.1);
  calling this with ``current=base`` reproduces that, feeding back the result makes it a
  multiplicative controller.
* :func:`dynamic_beta`, our reading of the seed's "adjust the unfinished-token limit from GPU
  utilisation": x0.9 above 90% GPU utilisation (saturated engines should queue less), x1.1
  below 60% (idle GPUs may take more), clamped to [lo, hi].
* :func:`dynamic_quota`, our reading of the seed's "dynamic quota adjustment" remedy for long
  tails (6.2): x0.9 when the TTFT tail (p99 / p50 of the interval's turns) is above 4 (a
  smaller compute quota chunks long prompts finer, so short ones stop queueing behind them),
  x1.1 below 2 (bigger batches, fewer per-batch costs), clamped to [lo, hi].

:mod:`.controllers` runs these on a schedule with a bound on each step; the runtime's
scheduler and the simulator both call it.
"""

from __future__ import annotations

import math

__all__ = [
    "alpha_bytes_from_bdp",
    "bytes_to_tokens",
    "tokens_readable",
    "read_seconds",
    "tokens_processable",
    "dynamic_alpha",
    "dynamic_beta",
    "dynamic_quota",
    "step_controller",
]


def alpha_bytes_from_bdp(bandwidth: float, latency: float) -> float:
    """The seed's rule: bytes in flight on a link of ``bandwidth`` B/s over ``latency`` s."""
    return bandwidth * latency


def bytes_to_tokens(amount: float, bytes_per_token: int) -> int:
    """Whole tokens whose KV fits in ``amount`` bytes (at least 0)."""
    if bytes_per_token <= 0:
        raise ValueError("bytes_per_token must be positive")
    return max(0, math.floor(amount / bytes_per_token))


def tokens_readable(bandwidth: float, bytes_per_token: int, window: float) -> int:
    """The paper's alpha: tokens of KV a ``bandwidth`` B/s storage NIC reads in ``window`` s."""
    return bytes_to_tokens(bandwidth * window, bytes_per_token)


def read_seconds(tokens: float, bytes_per_token: int, bandwidth: float) -> float | None:
    """Seconds a ``bandwidth`` B/s storage NIC takes to read ``tokens`` tokens of KV (the
    inverse of :func:`tokens_readable`: alpha as the config gives it); None without a rate."""
    return tokens * bytes_per_token / bandwidth if bandwidth > 0 else None


def tokens_processable(tokens_per_s: float, window: float) -> int:
    """The paper's beta: tokens one GPU processes in ``window`` seconds."""
    return max(0, math.floor(tokens_per_s * window))


def step_controller(current: float, utilisation: float, *, lo: float, hi: float,
                    high_util: float, low_util: float, down: float = 0.9,
                    up: float = 1.1) -> float:
    """``current * down`` above ``high_util``, ``* up`` below ``low_util``, clamped to [lo, hi].

    Raises:
        ValueError: on a negative or NaN utilisation, ``lo > hi``, or ``low_util > high_util``.
    """
    if not utilisation >= 0.0:
        raise ValueError(f"utilisation must be >= 0, got {utilisation}")
    if lo > hi:
        raise ValueError(f"bounds reversed: lo={lo} > hi={hi}")
    if low_util > high_util:
        raise ValueError(f"low_util {low_util} above high_util {high_util}")
    if utilisation > high_util:
        current *= down
    elif utilisation < low_util:
        current *= up
    return min(hi, max(lo, current))


def dynamic_alpha(current: float, snic_util: float, *, lo: float, hi: float,
                  high_util: float = 0.8, low_util: float = 0.5) -> float:
    """The seed's dynamic alpha: x0.9 above 80% storage-NIC utilisation, x1.1 below 50%."""
    return step_controller(current, snic_util, lo=lo, hi=hi, high_util=high_util,
                           low_util=low_util)


def dynamic_beta(current: float, gpu_util: float, *, lo: float, hi: float,
                 high_util: float = 0.9, low_util: float = 0.6) -> float:
    """Dynamic beta: x0.9 above 90% GPU utilisation, x1.1 below 60% (see module doc)."""
    return step_controller(current, gpu_util, lo=lo, hi=hi, high_util=high_util,
                           low_util=low_util)


def dynamic_quota(current: float, ttft_tail: float, *, lo: float, hi: float,
                  high_tail: float = 4.0, low_tail: float = 2.0) -> float:
    """Dynamic compute quota: x0.9 when TTFT p99/p50 is above 4, x1.1 below 2 (module doc)."""
    return step_controller(current, ttft_tail, lo=lo, hi=hi, high_util=high_tail,
                           low_util=low_tail)
