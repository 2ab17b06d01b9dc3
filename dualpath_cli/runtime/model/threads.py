"""Keep BLAS single-threaded inside an engine process.

Several engine processes share the machine's cores; a multi-threaded BLAS in each would
oversubscribe them and make timings noisy. (Results do not depend on it: the model's matmuls
are exact, see :mod:`.numerics`.) Call :func:`limit_blas_threads` first thing in an engine
process. It sets the usual environment variables, which BLAS reads when numpy is first
imported, and, when numpy is already loaded, resizes the live pools through ``threadpoolctl``
if that package is installed.
"""

from __future__ import annotations

import os
import sys

__all__ = ["BLAS_THREAD_ENV_VARS", "limit_blas_threads"]

BLAS_THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)

_limiter: object | None = None  # keeps threadpoolctl's limiter alive for the process


def limit_blas_threads(n: int = 1) -> bool:
    """Limit BLAS/OpenMP pools to ``n`` threads; True when the limit is in force.

    False means numpy was imported before this call and ``threadpoolctl`` is not installed,
    so only child processes started afterwards inherit the limit.
    """
    global _limiter
    for var in BLAS_THREAD_ENV_VARS:
        os.environ[var] = str(n)
    if "numpy" not in sys.modules:
        return True
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return False
    _limiter = threadpool_limits(limits=n)
    return True
