"""Agentic workloads: trajectories, the trace format, the Table 2 generator, Mooncake traces.

Pure except :mod:`dualpath_cli.workload.trace_io`, the one module that reads and writes files.
"""

from __future__ import annotations

from dualpath_cli.workload.augment import DEFAULT_PREFIX_TOKENS, augment
from dualpath_cli.workload.build import DEFAULT_BASE_AGENTS, synthetic_trace
from dualpath_cli.workload.mooncake import (
    MOONCAKE_BLOCK_TOKENS,
    MooncakeRequest,
    MooncakeStats,
    decode_mooncake,
    mooncake_stats,
    prefix_hits,
)
from dualpath_cli.workload.stats import TraceStats, trace_stats
from dualpath_cli.workload.synthetic import GeneratorParams, calibrate, generate
from dualpath_cli.workload.table2 import TABLE2, Table2Row, targets_for
from dualpath_cli.workload.tokens import (
    append_token_ids,
    gen_token_ids,
    prompt_token_ids,
    seeded_ids,
)
from dualpath_cli.workload.trace_format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    Trace,
    TraceHeader,
    decode_lines,
    encode_lines,
)
from dualpath_cli.workload.trajectory import Trajectory, Turn, truncate

__all__ = [
    "DEFAULT_BASE_AGENTS",
    "DEFAULT_PREFIX_TOKENS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MOONCAKE_BLOCK_TOKENS",
    "TABLE2",
    "GeneratorParams",
    "MooncakeRequest",
    "MooncakeStats",
    "Table2Row",
    "Trace",
    "TraceHeader",
    "TraceStats",
    "Trajectory",
    "Turn",
    "append_token_ids",
    "augment",
    "calibrate",
    "decode_lines",
    "decode_mooncake",
    "encode_lines",
    "gen_token_ids",
    "generate",
    "mooncake_stats",
    "prefix_hits",
    "prompt_token_ids",
    "seeded_ids",
    "synthetic_trace",
    "targets_for",
    "trace_stats",
    "truncate",
]
