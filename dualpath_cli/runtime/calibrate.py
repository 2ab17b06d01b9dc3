"""The reference model's compute rate on this machine: the predictor's peak and the share now.

Why: compute-quota batching (paper 6.5) maps a batch's FLOPs to time with a fit profiled in
advance; for the CPU reference model that fit is one achieved FLOP/s rate, measured here once
per process and model (a few prefills, about 0.1 s): :func:`calibrate_flops_rate`, the best
of a few probes, i.e. the engine's speed when it has a core.

The bench needs a different number: the rate an engine will get *during the run*, on a
machine that other processes may share, to size the experiment's storage NICs
(services/bench.py). :func:`measure_flops_rate` probes for a while in a separate process
with single-threaded BLAS, exactly as an engine process computes, on a chunk of the
workload's own mean shape (the reference model is small enough that per-forward overhead
makes the rate depend on the shape), and takes the median: the typical share of the CPU now,
not the luckiest sample.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import statistics
import time
from dataclasses import dataclass

from dualpath_cli.errors import UsageError
from dualpath_cli.runtime.model import load_model
from dualpath_cli.runtime.model.threads import BLAS_THREAD_ENV_VARS, limit_blas_threads
from dualpath_cli.runtime.model.timing import time_prefill

__all__ = ["calibrate_flops_rate", "FlopsSample", "measure_flops_rate", "probe_flops_rates"]

_PROBE_NEW, _PROBE_CACHED = 128, 512


@functools.cache
def calibrate_flops_rate(model: str = "tiny", repeats: int = 3) -> float:
    """Achieved prefill FLOP/s of ``model``: model FLOPs of a probe chunk / its best time."""
    ref = load_model(model)
    seconds = time_prefill(ref, _PROBE_NEW, _PROBE_CACHED, repeats=repeats)
    flops = ref.config.to_profile().prefill_flops(_PROBE_CACHED, _PROBE_NEW)
    return flops / max(seconds, 1e-6)


@dataclass(frozen=True, slots=True)
class FlopsSample:
    """A measured compute rate: the median of ``probes`` timed prefills over ``seconds``."""

    rate: float
    probes: int
    seconds: float
    low: float
    high: float


def probe_flops_rates(model: str, seconds: float, new: int = _PROBE_NEW,
                      cached: int = _PROBE_CACHED, min_probes: int = 3) -> list[float]:
    """Prefill FLOP/s of back-to-back chunks of ``new`` tokens after ``cached``, for at least
    ``seconds`` and ``min_probes`` probes, in this process (as it is: call it from a
    single-threaded BLAS one)."""
    if new < 1 or cached < 0 or seconds < 0:
        raise UsageError("a FLOP-rate probe needs new >= 1, cached >= 0 and seconds >= 0")
    ref = load_model(model)
    flops = ref.config.to_profile().prefill_flops(cached, new)
    time_prefill(ref, new, cached, repeats=1)  # warm caches and allocator
    rates: list[float] = []
    t0 = time.perf_counter()
    while len(rates) < min_probes or time.perf_counter() - t0 < seconds:
        rates.append(flops / max(time_prefill(ref, new, cached, repeats=1), 1e-6))
    return rates


def _probe_child(model: str, seconds: float, new: int, cached: int) -> list[float]:
    limit_blas_threads(1)  # in force: the child inherited the environment set below
    return probe_flops_rates(model, seconds, new, cached)


def measure_flops_rate(model: str = "tiny", seconds: float = 1.0, *, new: int = _PROBE_NEW,
                       cached: int = _PROBE_CACHED) -> FlopsSample:
    """Median prefill FLOP/s of ``model`` on ``new`` tokens after ``cached``, over about
    ``seconds`` of probes in a fresh single-threaded-BLAS process (an engine's view of the
    CPU right now; the spawn adds about a second)."""
    t0 = time.perf_counter()
    keep = {k: os.environ.get(k) for k in BLAS_THREAD_ENV_VARS}
    os.environ.update(dict.fromkeys(BLAS_THREAD_ENV_VARS, "1"))  # read at the child's import
    try:
        with mp.get_context("spawn").Pool(1) as pool:
            rates = pool.apply(_probe_child, (model, seconds, new, cached))
    finally:
        for k, v in keep.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return FlopsSample(statistics.median(rates), len(rates),
                       round(time.perf_counter() - t0, 3), min(rates), max(rates))
