"""The PE's compute predictor rate, measured on this machine from the reference model.

Why: compute-quota batching (paper 6.5) maps a batch's FLOPs to time with a fit profiled in
advance; for the CPU reference model that fit is one achieved FLOP/s rate, measured here once
per process and model (a few prefills, about 0.1 s).
"""

from __future__ import annotations

import functools

from dualpath_cli.runtime.model import load_model
from dualpath_cli.runtime.model.timing import time_prefill

__all__ = ["calibrate_flops_rate"]

_PROBE_NEW, _PROBE_CACHED = 128, 512


@functools.cache
def calibrate_flops_rate(model: str = "tiny", repeats: int = 3) -> float:
    """Achieved prefill FLOP/s of ``model``: model FLOPs of a probe chunk / its best time."""
    ref = load_model(model)
    seconds = time_prefill(ref, _PROBE_NEW, _PROBE_CACHED, repeats=repeats)
    flops = ref.config.to_profile().prefill_flops(_PROBE_CACHED, _PROBE_NEW)
    return flops / max(seconds, 1e-6)
