"""Measured compute time of the reference model, to calibrate the simulator's cost model.

Kept apart from the forward path: these functions build throwaway caches and time repeated
runs; the engines never call them while serving.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from dualpath_cli.errors import UsageError
from dualpath_cli.runtime.model.kvcache import KV_NP_DTYPE, KVCache
from dualpath_cli.runtime.model.numerics import KV_GRID_BITS
from dualpath_cli.runtime.model.transformer import ReferenceModel

__all__ = ["filler_cache", "time_decode", "time_prefill"]


def filler_cache(model: ReferenceModel, n_tokens: int, seed: int = 0) -> KVCache:
    """A cache of ``n_tokens`` random (but valid, on-grid) KV, as cheap stand-in context."""
    cfg = model.config
    rng = np.random.default_rng(seed)
    shape = (cfg.n_layers, n_tokens, cfg.kv_bytes_per_token_layer // KV_NP_DTYPE.itemsize)
    values = rng.integers(-2**KV_GRID_BITS, 2**KV_GRID_BITS, shape) * 2.0**-KV_GRID_BITS
    raw = values.astype(KV_NP_DTYPE).view(np.uint8)
    return KVCache.from_bytes(cfg, raw)


def _best_of(repeats: int, setup: Callable[[], list[KVCache]],
             run: Callable[[list[KVCache]], object]) -> float:
    """Fastest of ``repeats`` timed ``run(setup())`` calls; ``setup`` is not timed."""
    if repeats < 1:
        raise UsageError(f"repeats must be >= 1, got {repeats}")
    best = float("inf")
    for _ in range(repeats):
        caches = setup()
        t0 = time.perf_counter()
        run(caches)
        best = min(best, time.perf_counter() - t0)
    return best


def time_prefill(model: ReferenceModel, n_new: int, n_cached: int = 0, *,
                 batch: int = 1, repeats: int = 3) -> float:
    """Seconds (best of ``repeats``) to prefill ``n_new`` tokens after ``n_cached``, per batch.

    ``batch`` sequences of that shape are prefilled together, as an engine batches them.
    """
    if n_new < 1 or n_cached < 0 or batch < 1:
        raise UsageError("time_prefill needs n_new >= 1, n_cached >= 0 and batch >= 1")
    base = filler_cache(model, n_cached)
    tokens = np.random.default_rng(1).integers(0, 256, n_new)
    return _best_of(repeats, lambda: [base.copy() for _ in range(batch)],
                    lambda caches: model.prefill_batch([tokens] * batch, caches))


def time_decode(model: ReferenceModel, n_cached: int, *, batch: int = 1,
                steps: int = 4, repeats: int = 3) -> float:
    """Seconds of one decode step for ``batch`` sequences each after ``n_cached`` tokens."""
    if n_cached < 0 or batch < 1 or steps < 1:
        raise UsageError("time_decode needs n_cached >= 0, batch >= 1 and steps >= 1")
    base = filler_cache(model, n_cached)

    def run(caches: list[KVCache]) -> None:
        for _ in range(steps):
            model.decode_batch([65] * batch, caches)

    return _best_of(repeats, lambda: [base.copy() for _ in range(batch)], run) / steps
