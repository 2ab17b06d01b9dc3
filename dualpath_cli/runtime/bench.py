"""The main job: run one agentic workload under several policies and compare them.

Each policy gets a fresh system and a fresh store (so turn 1 of every agent is a miss under
every policy), the same trajectories and the same NIC shaping. The report holds, per policy:
JCT, TTFT/TTST/TPOT percentiles, storage-NIC bytes read per node and their Max/Avg, GPU busy
fraction, attention-bubble time, and whether the tokens matched the first policy's.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dualpath_cli.runtime.runner import RunResult, TurnRecord, percentile, run_agents
from dualpath_cli.runtime.system import RuntimeOptions, RuntimeSystem
from dualpath_cli.workload.trajectory import Trajectory

__all__ = ["PolicyReport", "BenchReport", "run_policy", "run_bench"]


@dataclass
class PolicyReport:
    """What one policy achieved on the workload."""

    policy: str
    jct_s: float
    turns: int
    ttft_p50_s: float
    ttft_p99_s: float
    ttst_p50_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    snic_read_bytes: dict[int, int]
    snic_max_avg: float
    gpu_busy: float
    bubble_s: float
    cached_tokens: int
    errors: list[str] = field(default_factory=list)
    tokens_match: bool = True

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


@dataclass
class BenchReport:
    """All policies' reports plus the run's setup."""

    setup: dict[str, Any]
    policies: list[PolicyReport]

    def to_dict(self) -> dict[str, Any]:
        """JSON form: setup, per-policy reports and the headline maps."""
        return {
            "setup": self.setup,
            "policies": [p.to_dict() for p in self.policies],
            "jct_s": {p.policy: p.jct_s for p in self.policies},
            "snic_max_avg": {p.policy: p.snic_max_avg for p in self.policies},
        }


def _max_avg(values: Sequence[float]) -> float:
    if not values or sum(values) == 0:
        return float("nan")
    return max(values) / (sum(values) / len(values))


def _summarise(policy: str, system: RuntimeSystem, run: RunResult,
               reports: dict[int, dict[str, Any]]) -> PolicyReport:
    per_node: dict[int, int] = {}
    busy = bubble = 0.0
    for spec in system.specs:
        rep = reports.get(spec.engine_id, {})
        per_node[spec.node] = per_node.get(spec.node, 0) + int(rep.get("snic_read_bytes", 0))
        busy += float(rep.get("busy_s", 0.0))
        bubble += float(rep.get("bubble_s", 0.0))
    turns = run.turns
    n_eng = max(len(system.specs), 1)

    def pct(attr: str, q: float) -> float:
        vals = [getattr(t, attr) for t in turns if getattr(t, attr) == getattr(t, attr)]
        return percentile(vals, q)

    return PolicyReport(
        policy, run.jct, len(turns), pct("ttft", 50), pct("ttft", 99), pct("ttst", 50),
        pct("tpot", 50), pct("tpot", 99), per_node, _max_avg(list(per_node.values())),
        busy / (run.jct * n_eng) if run.jct > 0 else 0.0, bubble,
        sum(t.cached for t in turns), list(run.errors))


def run_policy(policy: str, base: RuntimeOptions, trajectories: Sequence[Trajectory],
               store_root: Path, *, aps: float | None = None,
               on_turn: Callable[[TurnRecord], None] | None = None) -> tuple[PolicyReport,
                                                                               RunResult]:
    """Run ``trajectories`` under ``policy`` on a fresh store below ``store_root``."""
    store = Path(tempfile.mkdtemp(prefix=f"{policy}-", dir=store_root))
    opts = RuntimeOptions(**{**base.__dict__, "policy": policy, "store_dir": store})
    try:
        with RuntimeSystem(opts) as system:
            run = run_agents(system, trajectories, aps=aps, on_turn=on_turn)
            reports = system.scheduler.fresh_reports(time.monotonic())
            return _summarise(policy, system, run, reports), run
    finally:
        shutil.rmtree(store, ignore_errors=True)


def run_bench(policies: Sequence[str], base: RuntimeOptions,
              trajectories: Sequence[Trajectory], store_root: Path, *,
              aps: float | None = None,
              on_turn: Callable[[str, TurnRecord], None] | None = None) -> BenchReport:
    """Run every policy in turn; mark policies whose tokens differ from the first one's."""
    store_root.mkdir(parents=True, exist_ok=True)
    reports: list[PolicyReport] = []
    first: dict[tuple[int, int], tuple[int, ...]] | None = None
    for policy in policies:
        cb = None
        if on_turn is not None:
            def cb(rec: TurnRecord, p: str = policy, f: Callable[[str, TurnRecord], None] = (
                    on_turn)) -> None:
                f(p, rec)
        rep, run = run_policy(policy, base, trajectories, store_root, aps=aps, on_turn=cb)
        tokens = run.tokens_by_turn()
        if first is None:
            first = tokens
        rep.tokens_match = tokens == first
        reports.append(rep)
    setup = {"pd": f"{base.prefill_nodes}P{base.decode_nodes}D",
             "gpus_per_node": base.gpus_per_node, "model": base.model,
             "block_tokens": base.block_tokens, "snic_bw": base.snic_bw,
             "cnic_bw": base.cnic_bw, "agents": len(trajectories),
             "turns": sum(t.num_turns for t in trajectories),
             "mode": "offline" if aps is None else f"online {aps} APS"}
    return BenchReport(setup, reports)
