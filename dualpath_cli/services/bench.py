"""The main job: run one agentic workload under several policies and compare them.

Each policy gets a fresh system and a fresh store (so turn 1 of every agent is a miss under
every policy), the same trajectories and the same NIC shaping. The report holds, per policy:
JCT, TTFT/TTST/TPOT percentiles and whether the (scaled) SLO holds, storage-NIC bytes read
per node and their Max/Avg, GPU busy fraction, attention-bubble time, PE batching, and
whether the tokens matched the first policy's.

The setup comes from the deployment config (:func:`load_bench_config`). Three keys have
bench defaults that apply only when nothing (preset, file, env, flag) set them, because the
config defaults describe a GPU deployment while the bench must be I/O-bound on a CPU model:
the storage-NIC bandwidth (see :data:`BENCH_SNIC`), the fetch period (a CPU turn lasts tens
of milliseconds, so a 100 ms pull would dominate it) and beta's reference context and append
(the workload's mean cached context and append, so that beta is five seconds of *this*
workload's prefill).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.config import LoadedConfig, load_config
from dualpath_cli.core.balance import max_over_avg
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.services.runner import RunResult, TurnRecord, percentile, run_agents
from dualpath_cli.workload.trajectory import Trajectory

__all__ = ["BENCH_SNIC", "BENCH_FETCH", "SLO", "PolicyReport", "BenchReport",
           "load_bench_config", "run_policy", "run_bench"]

BENCH_SNIC = "7MB/s"
"""Storage-NIC bandwidth per node when unset: reading the workload's KV over all three 1P2D
nodes' NICs takes a little less than its compute, while one NIC (PE-only reads) takes about
2.5x as long, so storage is the bottleneck of PE-only reads only. At 5 MB/s even three NICs
bound the run (docs/benchmarks.md, "Embedded runtime", has the sweep)."""
BENCH_FETCH = "5ms"


@dataclass(frozen=True, slots=True)
class SLO:
    """The paper's online SLO (TTFT <= 4 s, TPOT <= 50 ms) times ``scale`` for a small model.

    It holds when the p99 TTFT and the p99 TPOT are both within their limits.
    """

    scale: float = 0.25
    ttft_s: float = 4.0
    tpot_s: float = 0.05

    @property
    def ttft_limit(self) -> float:
        """Scaled TTFT limit (seconds)."""
        return self.ttft_s * self.scale

    @property
    def tpot_limit(self) -> float:
        """Scaled TPOT limit (seconds)."""
        return self.tpot_s * self.scale


@dataclass
class PolicyReport:
    """What one policy achieved on the workload."""

    policy: str
    jct_s: float
    turns: int
    ttft_p50_s: float
    ttft_p99_s: float
    ttst_p50_s: float
    ttst_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    slo_met: bool
    snic_read_bytes: dict[int, int]
    snic_max_avg: float
    gpu_busy: float
    bubble_s: float
    cached_tokens: int
    pe_batch_mean: float
    pe_chunks: int
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


def mean_context_and_append(trajectories: Sequence[Trajectory]) -> tuple[int, int]:
    """Mean cached context and mean appended tokens per turn: beta's profiling point."""
    turns = [(t.hit_length(i), t.turns[i].append)
             for t in trajectories for i in range(t.num_turns)]
    if not turns:
        return 0, 1
    context = round(sum(c for c, _ in turns) / len(turns))
    append = max(1, round(sum(a for _, a in turns) / len(turns)))
    return context, append


def load_bench_config(trajectories: Sequence[Trajectory], *, preset: str | None = None,
                      config_file: Path | None = None, sets: Sequence[str] = (),
                      snic_bw: str | None = None) -> tuple[LoadedConfig, list[str]]:
    """The effective config for a bench run and the bench defaults that were applied.

    ``snic_bw`` (the ``--snic-bw`` flag) wins over everything; otherwise the bench defaults
    apply only to keys nothing else set (module docstring).
    """
    flags = list(sets) + ([f"hardware.snic_bandwidth={snic_bw}"] if snic_bw else [])
    loaded = load_config(preset=preset, config_file=config_file, overrides=flags)
    context, append = mean_context_and_append(trajectories)
    wanted = {"hardware.snic_bandwidth": BENCH_SNIC, "scheduler.fetch_period": BENCH_FETCH,
              "scheduler.reference_context": str(context),
              "scheduler.reference_append": str(append)}
    extra = [f"{k}={v}" for k, v in wanted.items()
             if loaded.source(k).kind in ("default", "profile")]
    if extra:
        loaded = load_config(preset=preset, config_file=config_file,
                             overrides=[*extra, *flags])
    return loaded, extra


def _summarise(policy: str, system: RuntimeSystem, run: RunResult,
               reports: dict[int, dict[str, Any]], slo: SLO) -> PolicyReport:
    per_node: dict[int, int] = {}
    busy = bubble = 0.0
    batches = items = chunks = 0
    for spec in system.specs:
        rep = reports.get(spec.engine_id, {})
        per_node[spec.node] = per_node.get(spec.node, 0) + int(rep.get("snic_read_bytes", 0))
        busy += float(rep.get("busy_s", 0.0))
        bubble += float(rep.get("bubble_s", 0.0))
        if spec.role == "prefill":
            batches += int(rep.get("batches", 0))
            items += int(rep.get("batched_items", 0))
            chunks += int(rep.get("chunks", 0))
    turns = run.turns
    n_eng = max(len(system.specs), 1)

    def pct(attr: str, q: float) -> float:
        vals = [getattr(t, attr) for t in turns if getattr(t, attr) == getattr(t, attr)]
        return percentile(vals, q)

    ttft99, tpot99 = pct("ttft", 99), pct("tpot", 99)
    return PolicyReport(
        policy, run.jct, len(turns), pct("ttft", 50), ttft99, pct("ttst", 50),
        pct("ttst", 99), pct("tpot", 50), tpot99,
        ttft99 <= slo.ttft_limit and tpot99 <= slo.tpot_limit, per_node,
        max_over_avg(list(per_node.values())),
        busy / (run.jct * n_eng) if run.jct > 0 else 0.0, bubble,
        sum(t.cached for t in turns), items / batches if batches else 0.0, chunks,
        list(run.errors))


def run_policy(policy: str, base: RuntimeOptions, trajectories: Sequence[Trajectory],
               store_root: Path, *, aps: float | None = None, slo: SLO = SLO(),
               on_turn: Callable[[TurnRecord], None] | None = None) -> tuple[PolicyReport,
                                                                               RunResult]:
    """Run ``trajectories`` under ``policy`` on a fresh store below ``store_root``."""
    store = Path(tempfile.mkdtemp(prefix=f"{policy}-", dir=store_root))
    opts = dataclasses.replace(base, policy=policy, store_dir=store)
    try:
        with RuntimeSystem(opts) as system:
            run = run_agents(system, trajectories, aps=aps, on_turn=on_turn)
            reports = system.scheduler.fresh_reports(time.monotonic())
            return _summarise(policy, system, run, reports, slo), run
    finally:
        shutil.rmtree(store, ignore_errors=True)


def run_bench(policies: Sequence[str], base: RuntimeOptions,
              trajectories: Sequence[Trajectory], store_root: Path, *,
              aps: float | None = None, slo: SLO = SLO(),
              on_turn: Callable[[str, TurnRecord], None] | None = None,
              setup: dict[str, Any] | None = None) -> BenchReport:
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
        rep, run = run_policy(policy, base, trajectories, store_root, aps=aps, slo=slo,
                              on_turn=cb)
        tokens = run.tokens_by_turn()
        if first is None:
            first = tokens
        rep.tokens_match = tokens == first
        reports.append(rep)
    info = {"pd": f"{base.prefill_nodes}P{base.decode_nodes}D",
            "gpus_per_node": base.gpus_per_node, "model": base.model,
            "block_tokens": base.block_tokens, "snic_bw": base.snic_bw,
            "cnic_bw": base.cnic_bw, "alpha": base.alpha, "beta": base.beta,
            "quota_s": base.quota_s, "fetch_s": base.fetch_s, "agents": len(trajectories),
            "turns": sum(t.num_turns for t in trajectories),
            "mode": "offline" if aps is None else f"online {aps} APS",
            "slo": {"scale": slo.scale, "ttft_s": slo.ttft_limit, "tpot_s": slo.tpot_limit}}
    info.update(setup or {})
    return BenchReport(info, reports)
