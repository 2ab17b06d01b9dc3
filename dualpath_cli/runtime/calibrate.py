"""The reference model's compute rate on this machine: the predictor's peak and the share now.

Why: compute-quota batching (paper 6.5) maps a batch's FLOPs to time with a fit profiled in
advance; for the CPU reference model that fit is one achieved FLOP/s rate, measured here once
per process and model (a few prefills, about 0.1 s): :func:`calibrate_flops_rate`, the best
of a few probes, i.e. the engine's speed when it has a core.

The bench needs a different number: the rate an engine will get *during the run*, on a
machine that other processes may share, to size the experiment's storage NICs
(services/bench.py). :func:`measure_flops_rate` probes for a while in a separate process
(a plain subprocess: no multiprocessing semaphore to leak) with single-threaded BLAS,
exactly as an engine process computes, on a chunk of the workload's own mean shape (the
reference model is small enough that per-forward overhead makes the rate depend on the
shape), and takes the median: the typical share of the CPU now, not the luckiest sample.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from dualpath_cli.errors import EXIT_USAGE, DualPathError, UsageError
from dualpath_cli.runtime.model import load_model
from dualpath_cli.runtime.model.threads import BLAS_THREAD_ENV_VARS, limit_blas_threads
from dualpath_cli.runtime.model.timing import time_prefill

__all__ = ["calibrate_flops_rate", "FlopsSample", "measure_flops_rate", "probe_flops_rates"]

_PROBE_NEW, _PROBE_CACHED = 128, 512


@functools.cache
def calibrate_flops_rate(model: str = "tiny", repeats: int = 3, *, new: int = _PROBE_NEW,
                         cached: int = _PROBE_CACHED) -> float:
    """Achieved prefill FLOP/s of ``model``: model FLOPs of a probe chunk of ``new`` tokens
    after ``cached`` / its best time (the rate depends on the shape: the reference model
    computes long prompts faster per FLOP)."""
    _check_probe(0.0, new, cached)
    ref = load_model(model)
    seconds = time_prefill(ref, new, cached, repeats=repeats)
    flops = ref.config.to_profile().prefill_flops(cached, new)
    return flops / max(seconds, 1e-6)


@dataclass(frozen=True, slots=True)
class FlopsSample:
    """A measured compute rate: the median of ``probes`` timed prefills over ``seconds``."""

    rate: float
    probes: int
    seconds: float
    low: float
    high: float


def _check_probe(seconds: float, new: int, cached: int) -> None:
    if new < 1 or cached < 0 or seconds < 0:
        raise UsageError("a FLOP-rate probe needs new >= 1, cached >= 0 and seconds >= 0")


def probe_flops_rates(model: str, seconds: float, new: int = _PROBE_NEW,
                      cached: int = _PROBE_CACHED, min_probes: int = 3) -> list[float]:
    """Prefill FLOP/s of back-to-back chunks of ``new`` tokens after ``cached``, for at least
    ``seconds`` and ``min_probes`` probes, in this process (as it is: call it from a
    single-threaded BLAS one)."""
    _check_probe(seconds, new, cached)
    ref = load_model(model)
    flops = ref.config.to_profile().prefill_flops(cached, new)
    time_prefill(ref, new, cached, repeats=1)  # warm caches and allocator
    rates: list[float] = []
    t0 = time.perf_counter()
    while len(rates) < min_probes or time.perf_counter() - t0 < seconds:
        rates.append(flops / max(time_prefill(ref, new, cached, repeats=1), 1e-6))
    return rates


#: The probe process: imports this module fresh, with single-threaded BLAS in its environment.
_PROBE_CHILD = ("import sys; from dualpath_cli.runtime.calibrate import _probe_main; "
                "sys.exit(_probe_main(sys.argv[1:]))")


def _probe_main(argv: list[str]) -> int:
    """The probe process's body: the rates as one JSON line on stdout, or a toolkit error
    as one line on stderr and its exit code."""
    model, seconds, new, cached = argv
    limit_blas_threads(1)  # in force: the environment set it before numpy loaded
    try:
        rates = probe_flops_rates(model, float(seconds), int(new), int(cached))
    except DualPathError as err:
        print(err, file=sys.stderr)
        return err.exit_code
    print(json.dumps(rates))
    return 0


def measure_flops_rate(model: str = "tiny", seconds: float = 1.0, *, new: int = _PROBE_NEW,
                       cached: int = _PROBE_CACHED) -> FlopsSample:
    """Median prefill FLOP/s of ``model`` on ``new`` tokens after ``cached``, over about
    ``seconds`` of probes in a fresh single-threaded-BLAS process (an engine's view of the
    CPU right now; starting it adds about a second).

    The probe is a plain subprocess that prints its rates, not a multiprocessing pool: a
    pool's queues lock named POSIX semaphores (``/dev/shm/sem.mp-*``) that a SIGKILL to the
    process group during the probe would leave behind (its resource tracker dies too).

    Raises:
        UsageError: bad probe sizes or an unknown model (as the probe itself reports it).
        DualPathError: the probe process failed or ran past its time.
    """
    _check_probe(seconds, new, cached)
    t0 = time.perf_counter()
    env = {**os.environ, **dict.fromkeys(BLAS_THREAD_ENV_VARS, "1")}  # read at numpy's import
    argv = [sys.executable, "-c", _PROBE_CHILD, model, repr(float(seconds)), str(new),
            str(cached)]
    limit_s = 120.0 + 2 * seconds
    try:
        child = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                               text=True, timeout=limit_s, check=False)
    except subprocess.TimeoutExpired as err:
        raise DualPathError(f"the FLOP-rate probe of {model!r} ran past {limit_s:.0f} s") from err
    last = (child.stderr.strip().splitlines() or ["no output"])[-1]
    if child.returncode == EXIT_USAGE:
        raise UsageError(last)
    try:
        out = child.stdout.strip().splitlines()[-1:] if child.returncode == 0 else []
        rates = [float(r) for r in json.loads(out[0])] if out else []
    except (ValueError, TypeError):
        rates = []
    if not rates:
        raise DualPathError(f"the FLOP-rate probe of {model!r} failed "
                            f"(exit {child.returncode}): {last}")
    return FlopsSample(statistics.median(rates), len(rates),
                       round(time.perf_counter() - t0, 3), min(rates), max(rates))
