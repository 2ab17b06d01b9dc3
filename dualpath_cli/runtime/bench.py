"""Deprecated alias of :mod:`dualpath_cli.services.bench` (moved to the services layer).

Kept only because ``bench/validate_sim.py`` still imports this path; switch it to
``dualpath_cli.services.bench`` and delete this module. It is the one upward import left in
runtime/ (docs/architecture.md lists it under "Deviations").
"""

from dualpath_cli.services.bench import (
    BENCH_FETCH,
    BENCH_SNIC,
    SLO,
    BenchReport,
    PolicyReport,
    load_bench_config,
    run_bench,
    run_policy,
)

__all__ = ["BENCH_SNIC", "BENCH_FETCH", "SLO", "PolicyReport", "BenchReport",
           "load_bench_config", "run_policy", "run_bench"]
