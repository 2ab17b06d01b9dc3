"""Compute-time measurement (simulator calibration) and the BLAS thread limit."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dualpath_cli.core.reference_model import model_config
from dualpath_cli.errors import UsageError
from dualpath_cli.runtime.model import ReferenceModel, limit_blas_threads, threads
from dualpath_cli.runtime.model.kvcache import KVCache
from dualpath_cli.runtime.model.threads import BLAS_THREAD_ENV_VARS
from dualpath_cli.runtime.model.timing import filler_cache, time_decode, time_prefill

MODEL = ReferenceModel(model_config("tiny", {"n_layers": 2}))


def test_filler_cache_is_valid_kv() -> None:
    cache = filler_cache(MODEL, 40)
    assert isinstance(cache, KVCache) and cache.n_tokens == 40
    logits, _ = MODEL.prefill([1, 2, 3], cache)
    assert np.all(np.isfinite(logits))


def test_timings_are_positive_seconds() -> None:
    assert 0 < time_prefill(MODEL, 16, 32, repeats=1) < 10
    assert 0 < time_prefill(MODEL, 4, 0, batch=2, repeats=1) < 10
    assert 0 < time_decode(MODEL, 32, batch=2, steps=2, repeats=1) < 10
    with pytest.raises(UsageError):
        time_prefill(MODEL, 0)
    with pytest.raises(UsageError):
        time_decode(MODEL, 8, steps=0)


def test_limit_blas_threads_sets_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in BLAS_THREAD_ENV_VARS:
        monkeypatch.setenv(var, "7")  # restored after the test
    effective = limit_blas_threads(1)
    assert isinstance(effective, bool)
    assert all(os.environ[var] == "1" for var in BLAS_THREAD_ENV_VARS)
    limiter = threads._limiter  # with threadpoolctl installed: give the pools back
    if limiter is not None:
        limiter.restore_original_limits()  # type: ignore[attr-defined]
        monkeypatch.setattr(threads, "_limiter", None)
