"""The main job: run one agentic workload under several policies and compare them.

Each policy gets a fresh system and a fresh store (so turn 1 of every agent is a miss under
every policy), the same trajectories and the same NIC shaping. The report holds, per policy:
JCT, TTFT/TTST/TPOT percentiles and whether the (scaled) SLO holds, storage-NIC bytes read
per node and their Max/Avg, GPU busy fraction, attention-bubble time, PE batching, and
whether the tokens matched the first policy's.

The setup comes from the deployment config (:func:`load_bench_config`). Three keys have
bench defaults that apply only when nothing (preset, file, env, flag) set them, because the
config defaults describe a GPU deployment while the bench must sit in the paper's regime on a
CPU model: the storage-NIC bandwidth (calibrated to this machine, see
:func:`calibrate_snic`), the fetch period (a CPU turn lasts tens of milliseconds, so a 100 ms
pull would dominate it) and beta's reference context and append (the workload's mean cached
context and append, so that beta is five seconds of *this* workload's prefill).

Why calibrate the storage NIC: the paper's comparison is about a regime (Basic storage-bound,
DualPath not), not a bandwidth. A fixed rate leaves that regime as soon as the CPU is slower
than when the rate was chosen (at a fixed 7 MB/s basic/dualpath went from 2.65 to 1.06 with
other work on the machine). So the bench measures the compute rate first and sets the rate
that makes Basic's storage time :data:`REGIME_MULTIPLE` times the compute time. The rate
comes from a compute-only oracle run of the workload (:func:`calibrate_by_oracle`, what the
bench does by default) or from a probe of one engine's prefill (``load_bench_config`` alone,
cheaper; on a busy 2-core host it read about half the runtime's compute time).
"""

from __future__ import annotations

import dataclasses
import os
import re
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
from dualpath_cli.core.reference_model import model_config
from dualpath_cli.errors import UnitError, UsageError
from dualpath_cli.limits import check, check_count, check_finite
from dualpath_cli.runtime.calibrate import measure_flops_rate
from dualpath_cli.runtime.options import RuntimeOptions, runtime_model_for
from dualpath_cli.services.runner import RunResult, TurnRecord, percentile, run_agents
from dualpath_cli.storage.header import file_nbytes
from dualpath_cli.telemetry.hostload import ForeignCpu
from dualpath_cli.termination import temp_dir
from dualpath_cli.units import parse_bandwidth
from dualpath_cli.workload.trace_format import DEFAULT_BLOCK_TOKENS
from dualpath_cli.workload.trajectory import Trajectory

__all__ = ["REGIME_MULTIPLE", "BENCH_FETCH", "SLO", "PolicyReport", "BenchReport",
           "Demand", "SnicCalibration", "workload_demand", "calibrate_snic", "oracle_rate",
           "calibrate_by_oracle", "check_bench_inputs", "check_store_root",
           "remove_stale_stores", "keep_quarantine",
           "load_bench_config", "run_policy", "run_bench"]

REGIME_MULTIPLE = 2.5
"""Basic's storage time / compute time that the calibrated storage NIC sets (paper's regime).

From the paper's numbers: Figure 1 shows Basic's prefill GPU 40% busy while its storage NIC
is saturated, so reading takes 1 / 0.4 = 2.5 times the compute. Two checks: DualPath's
offline gain over Basic is up to 1.87x with DualPath close to the Oracle (section 7.3), so
Basic's storage time is at least ~1.9 compute times; and at the paper's default 2P4D DualPath
reads over 3x the NICs, 2.5 / 3 = 0.83 of the compute, which is why it can stay near the
Oracle. The same holds at the bench's 1P2D (three nodes, one of them a PE)."""
BENCH_FETCH = "5ms"
PROBE_SECONDS = 1.0
"""How long the bench probes the compute rate (a median over this window, see
runtime/calibrate.py): long enough to average over the other processes' bursts."""


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
    foreign_cores: float | None = None
    """Mean cores other processes kept busy during this policy's run (None: not measurable;
    telemetry/hostload.py): a busy neighbour slows the compute-bound policies."""
    dead_engines: list[int] = field(default_factory=list)
    """Engines whose process ended during the run (their turns were re-queued)."""
    retried_turns: int = 0
    """Turns served on a second or later attempt (a dead engine, a failed read)."""
    quarantined_blocks: int = 0
    """Corrupt blocks moved aside during the run; kept under ``quarantine_dir``."""
    quarantine_dir: str | None = None
    shared_cached_tokens: int = 0
    """Cached tokens another conversation stored: hit blocks past the agent's own stored
    chain, as the runtime's scheduler counts them
    (``dualpath_kv_cross_conversation_hit_tokens_total``; a shared system prompt, a forked
    conversation), as a global KV store sees them."""
    prompt_tokens: int = 0
    """Prompt tokens the scheduler looked up in the store
    (``dualpath_kv_requested_tokens_total{tier="store"}``)."""
    hit_tokens: int = 0
    """Of those, the tokens it found there (``dualpath_kv_hit_tokens_total{tier="store"}``):
    whole blocks of the runtime's size, one token of a prompt always computed."""
    store_read_bytes: dict[int, int] = field(default_factory=dict)
    """Bytes each node's loaders read from the store (``dualpath_storage_read_bytes_total``):
    what crossed its storage NIC. A block several requests asked for while its read was
    queued or in flight is read once (they join it), where ``snic_read_bytes`` counts it
    for each request."""

    @property
    def cross_conversation_hit_share(self) -> float:
        """Share of cached tokens another conversation stored (0 when nothing hit)."""
        return self.shared_cached_tokens / self.cached_tokens if self.cached_tokens else 0.0

    @property
    def hit_ratio(self) -> float:
        """Share of looked-up prompt tokens the store held (0 when none looked up)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {**asdict(self), "cross_conversation_hit_share": self.cross_conversation_hit_share,
                "hit_ratio": self.hit_ratio}


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


@dataclass(frozen=True, slots=True)
class Demand:
    """What a workload asks of a deployment: prefill FLOPs and KV bytes read from storage.

    Hits are whole blocks (the runtime's store serves only full blocks), and the bytes are
    block *files* (payload plus header), which is what the storage-NIC shaper charges.
    """

    prefill_flops: float
    read_bytes: int


def workload_demand(trajectories: Sequence[Trajectory], model: str,
                    block_tokens: int) -> Demand:
    """Prefill FLOPs and storage bytes of ``trajectories`` on the reference ``model``."""
    cfg = model_config(model)
    profile = cfg.to_profile()
    block_file = file_nbytes(cfg.n_layers * block_tokens * cfg.kv_bytes_per_token_layer)
    flops = 0.0
    nbytes = 0
    for t in trajectories:
        for i in range(t.num_turns):
            blocks = t.hit_length(i) // block_tokens
            cached = blocks * block_tokens
            flops += profile.prefill_flops(cached, t.prompt_length(i) - cached)
            nbytes += blocks * block_file
    return Demand(flops, nbytes)


@dataclass(frozen=True, slots=True)
class SnicCalibration:
    """How the bench sized the storage NICs: the measured rate and the regime it set.

    ``compute_s`` is the workload's prefill FLOPs over the prefill engines at the measured
    rate; ``basic_storage_s`` its KV bytes over the prefill nodes' NICs (Basic reads on the PE
    side only) and ``dualpath_storage_s`` over every node's NIC (both read paths).
    """

    flops_rate: float
    probes: int
    probe_s: float
    multiple: float
    snic_bw: float
    compute_s: float
    basic_storage_s: float
    dualpath_storage_s: float
    prefill_flops: float
    read_bytes: int
    source: str = "probe"
    """Where the rate came from: ``probe`` (one engine's prefill, runtime/calibrate.py) or
    ``oracle`` (the workload's FLOPs over a compute-only run's JCT, :func:`oracle_rate`)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


def oracle_rate(demand: Demand, oracle_jct_s: float, prefill_nodes: int) -> float:
    """The runtime's effective prefill FLOP/s per PE: the workload's FLOPs over the JCT of
    its compute-only (oracle) run. Why: the probe times one engine alone, while in a run the
    engines, their I/O threads and the scheduler share the cores (on a busy 2-core host the
    oracle took about twice the probe's compute time)."""
    if oracle_jct_s <= 0:
        raise UsageError("oracle_rate needs a positive oracle JCT")
    return demand.prefill_flops / (prefill_nodes * oracle_jct_s)


def calibrate_snic(demand: Demand, flops_rate: float, *, prefill_nodes: int,
                   decode_nodes: int, multiple: float = REGIME_MULTIPLE, probes: int = 0,
                   probe_s: float = 0.0, source: str = "probe") -> SnicCalibration:
    """The per-node storage-NIC rate at which Basic's storage time is ``multiple`` x compute.

    compute = F / (P x rate) and Basic's storage time = bytes / (P x snic), so
    snic = bytes x rate / (multiple x F): the same rate for any P/D (the prefill nodes' count
    cancels), rounded to three significant figures so the printed rate is the one used.
    """
    if flops_rate <= 0 or demand.prefill_flops <= 0 or multiple <= 0:
        raise UsageError("calibrate_snic needs a positive FLOP rate, prefill FLOPs and "
                         "multiple")
    compute = demand.prefill_flops / (prefill_nodes * flops_rate)
    raw = demand.read_bytes * flops_rate / (multiple * demand.prefill_flops)
    snic = float(f"{raw:.3g}") if raw > 0 else 0.0
    basic = demand.read_bytes / (prefill_nodes * snic) if snic else 0.0
    dual = demand.read_bytes / ((prefill_nodes + decode_nodes) * snic) if snic else 0.0
    return SnicCalibration(flops_rate, probes, probe_s, multiple, snic, compute, basic, dual,
                           demand.prefill_flops, demand.read_bytes, source)


_RUN_STORE = re.compile(r"^[\w.-]+-pid(\d+)-[\w]+$")


def remove_stale_stores(store_root: Path) -> list[Path]:
    """Remove per-policy stores under ``store_root`` whose bench process is gone."""
    removed: list[Path] = []
    try:
        entries = list(store_root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _RUN_STORE.match(entry.name)
        if match is None or not entry.is_dir() or _alive(int(match.group(1))):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def check_store_root(root: Path, flag: str = "--store") -> Path:
    """``root`` as a usable store directory, created if missing; else one line.

    A file, ``/dev/null``, ``/proc`` or a read-only mount is refused here, before any engine
    starts: a probe file is created and removed (permission bits alone miss a read-only
    mount, and root ignores them).
    """
    if root.exists() and not root.is_dir():
        raise UsageError(f"{flag} {root}: not a directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=root)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise UsageError(f"{flag} {root}: not a writable directory "
                         f"({err.strerror or err})") from None
    return root


def check_bench_inputs(*, agents: int, turns: int, aps: float | None, slo_scale: float,
                       store: Path | None, snic_bw: str | None = None) -> None:
    """Every input that sizes a bench run, checked before the workload is even built.

    ``--snic-bw`` is checked here under its own name (it later travels as a config
    override, whose error would blame a ``--set`` the user never gave).
    """
    if snic_bw is not None:
        try:
            rate = parse_bandwidth(snic_bw)
        except UnitError as err:
            raise UsageError(f"--snic-bw: {err}") from None
        if rate <= 0:
            raise UsageError(f"--snic-bw {snic_bw!r}: must be greater than zero")
    check_count("agents", agents, "--agents")
    check_count("turns", turns, "--turns")
    check("total_turns", agents * turns, "--agents x --turns")
    if aps is not None:
        check_finite(aps, "--aps", positive=True)
    check_finite(slo_scale, "--slo-scale", positive=True)
    if store is not None:
        check_store_root(store)


def check_engines(loaded: LoadedConfig) -> None:
    """The engine processes the config's P/D asks for, against the machine."""
    cluster = loaded.config.cluster
    check("engines", cluster.gpus, f"cluster.pd {cluster.pd} x {cluster.gpus_per_node} "
          "engines per node")


def load_bench_config(trajectories: Sequence[Trajectory], *, preset: str | None = None,
                      config_file: Path | None = None, sets: Sequence[str] = (),
                      snic_bw: str | None = None, flops_rate: float | None = None,
                      multiple: float = REGIME_MULTIPLE, rate_source: str = "probe",
                      ) -> tuple[LoadedConfig, list[str], SnicCalibration | None]:
    """The effective config for a bench run, the bench defaults applied, and the calibration.

    The compute rate is probed on the workload's mean turn (its mean cached context and
    append, beta's profiling point too).

    ``snic_bw`` (the ``--snic-bw`` flag) wins over everything; otherwise the bench defaults
    apply only to keys nothing else set (module docstring). When the storage NIC is left to
    the bench it is calibrated (:func:`calibrate_snic`) from ``flops_rate``, or from a rate
    measured now (:func:`~dualpath_cli.runtime.calibrate.measure_flops_rate`, about
    :data:`PROBE_SECONDS`) when that is None; the calibration is None when something else
    set the rate, or when the workload reads nothing from storage (then the config's rate
    stays).
    """
    flags = list(sets) + ([f"hardware.snic_bandwidth={snic_bw}"] if snic_bw else [])
    loaded = load_config(preset=preset, config_file=config_file, overrides=flags)
    check_engines(loaded)  # before the probe or any engine
    context, append = mean_context_and_append(trajectories)
    # a single-turn workload hits nothing (context 0), and a reference context must be > 0
    context = max(1, context)
    wanted = {"scheduler.fetch_period": BENCH_FETCH,
              "scheduler.reference_context": str(context),
              "scheduler.reference_append": str(append)}
    extra = [f"{k}={v}" for k, v in wanted.items()
             if loaded.source(k).kind in ("default", "profile")]
    calibration = None
    if loaded.source("hardware.snic_bandwidth").kind in ("default", "profile"):
        cfg = loaded.config
        model = runtime_model_for(cfg.model.profile)
        demand = workload_demand(trajectories, model, cfg.storage.block_size)
        if demand.read_bytes > 0:  # a workload with no cache hit has no storage regime
            probes, probe_s = 0, 0.0
            if flops_rate is None:
                sample = measure_flops_rate(model, PROBE_SECONDS, new=append, cached=context)
                flops_rate, probes, probe_s = sample.rate, sample.probes, sample.seconds
            calibration = calibrate_snic(
                demand, flops_rate, prefill_nodes=cfg.cluster.prefill_nodes,
                decode_nodes=cfg.cluster.decode_nodes, multiple=multiple, probes=probes,
                probe_s=probe_s, source=rate_source if probes == 0 else "probe")
            per_nic = calibration.snic_bw / cfg.hardware.snics_per_node
            extra.insert(0, f"hardware.snic_bandwidth={per_nic!r}B/s")
    if extra:
        loaded = load_config(preset=preset, config_file=config_file,
                             overrides=[*extra, *flags])
    return loaded, extra, calibration


def calibrate_by_oracle(trajectories: Sequence[Trajectory], base: RuntimeOptions,
                        store_root: Path, *, preset: str | None = None,
                        config_file: Path | None = None, sets: Sequence[str] = (),
                        multiple: float = REGIME_MULTIPLE,
                        block_tokens: int = DEFAULT_BLOCK_TOKENS,
                        ) -> tuple[LoadedConfig, list[str], SnicCalibration | None,
                                   tuple[PolicyReport, RunResult]]:
    """Run the oracle first and size the NICs from its JCT (:func:`oracle_rate`).

    Returns the re-resolved config, the bench defaults applied, the calibration and the
    oracle's (report, run), to reuse as its row (``run_bench(done=...)``): it crosses no
    shaped NIC, so the rate it ran with does not matter.
    """
    store_root.mkdir(parents=True, exist_ok=True)
    meter = ForeignCpu()
    meter.start()
    rep, run = run_policy("oracle", base, trajectories, store_root,
                          block_tokens=block_tokens)
    other = meter.stop()
    rep.foreign_cores = None if other is None else round(other, 3)
    demand = workload_demand(trajectories, base.model, base.block_tokens)
    rate = oracle_rate(demand, run.jct, base.prefill_nodes)
    loaded, applied, cal = load_bench_config(trajectories, preset=preset,
                                             config_file=config_file, sets=sets,
                                             flops_rate=rate, multiple=multiple,
                                             rate_source="oracle")
    return loaded, applied, cal, (rep, run)


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
    counted = system.scheduler.registry.value  # the runtime's own store lookups
    return PolicyReport(
        policy, run.jct, len(turns), pct("ttft", 50), ttft99, pct("ttst", 50),
        pct("ttst", 99), pct("tpot", 50), tpot99,
        ttft99 <= slo.ttft_limit and tpot99 <= slo.tpot_limit, per_node,
        max_over_avg(list(per_node.values())),
        busy / (run.jct * n_eng) if run.jct > 0 else 0.0, bubble,
        sum(t.cached for t in turns), items / batches if batches else 0.0, chunks,
        list(run.errors),
        shared_cached_tokens=int(counted("dualpath_kv_cross_conversation_hit_tokens_total")),
        prompt_tokens=int(counted("dualpath_kv_requested_tokens_total", tier="store")),
        hit_tokens=int(counted("dualpath_kv_hit_tokens_total", tier="store")),
        store_read_bytes=_store_read_bytes(system))


def _store_read_bytes(system: RuntimeSystem) -> dict[int, int]:
    """Bytes each node's loaders read (:attr:`PolicyReport.store_read_bytes`), from every
    live engine's metrics (asked for afresh; bounded wait)."""
    out: dict[int, int] = {}
    for snap in system.scheduler.metrics(fresh=True).values():
        rows = (snap.get("metrics") or {}).get("dualpath_storage_read_bytes_total", [])
        node = int(snap.get("node", -1))
        out[node] = out.get(node, 0) + int(sum(float(r.get("value", 0.0)) for r in rows))
    return out


def run_policy(policy: str, base: RuntimeOptions, trajectories: Sequence[Trajectory],
               store_root: Path, *, aps: float | None = None, slo: SLO = SLO(),
               on_turn: Callable[[TurnRecord], None] | None = None,
               block_tokens: int = DEFAULT_BLOCK_TOKENS) -> tuple[PolicyReport, RunResult]:
    """Run ``trajectories`` under ``policy`` on a fresh store below ``store_root``
    (``block_tokens``: tokens one id of their block chains covers, the trace header's).

    The store's name carries this process's pid, so that a run killed outright (SIGKILL:
    no ``finally``) leaves a store the next run recognises as stale and removes
    (:func:`remove_stale_stores`).
    """
    remove_stale_stores(store_root)
    with temp_dir(dir=store_root, prefix=f"{policy}-pid{os.getpid()}-") as store:
        opts = dataclasses.replace(base, policy=policy, store_dir=store)
        with RuntimeSystem(opts) as system:
            run = run_agents(system, trajectories, aps=aps, on_turn=on_turn,
                             block_tokens=block_tokens)
            reports = system.scheduler.fresh_reports(time.monotonic())
            rep = _summarise(policy, system, run, reports, slo)
            rep.dead_engines = sorted(system.down())  # before the shutdown; restarted ones serve
        rep.retried_turns = sum(1 for t in run.turns if t.attempts > 1)
        kept = keep_quarantine(store, store_root, policy)
        if kept is not None:
            rep.quarantined_blocks = sum(1 for _ in kept.iterdir())
            rep.quarantine_dir = str(kept)
        return rep, run


def keep_quarantine(store: Path, store_root: Path, policy: str) -> Path | None:
    """Move a run store's quarantined blocks to ``store_root/quarantine/POLICY-TIME`` (the
    run store itself is deleted), so they can be inspected after the run; None if none."""
    qdir = store / "quarantine"
    try:
        if not any(qdir.iterdir()):
            return None
    except OSError:
        return None
    dest = store_root / "quarantine" / f"{policy}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(qdir, dest)
    except OSError:
        return None
    return dest


def run_bench(policies: Sequence[str], base: RuntimeOptions,
              trajectories: Sequence[Trajectory], store_root: Path, *,
              aps: float | None = None, slo: SLO = SLO(),
              on_turn: Callable[[str, TurnRecord], None] | None = None,
              setup: dict[str, Any] | None = None,
              calibration: SnicCalibration | None = None,
              done: dict[str, tuple[PolicyReport, RunResult]] | None = None,
              block_tokens: int = DEFAULT_BLOCK_TOKENS) -> BenchReport:
    """Run every policy in turn; mark policies whose tokens differ from the first one's
    (``block_tokens``: tokens one id of the trajectories' block chains covers).

    ``done``: policies already run on this workload (the oracle run that calibrated the
    NICs, which crosses no shaped NIC), reused instead of run again.

    ``calibration``: how the storage NICs were sized, kept in the setup (None: the config
    or a flag set them). Each policy's report carries the CPU other processes took meanwhile.
    """
    store_root.mkdir(parents=True, exist_ok=True)
    reports: list[PolicyReport] = []
    meter = ForeignCpu()
    first: dict[tuple[int, int], tuple[int, ...]] | None = None
    for policy in policies:
        cb = None
        if on_turn is not None:
            def cb(rec: TurnRecord, p: str = policy, f: Callable[[str, TurnRecord], None] = (
                    on_turn)) -> None:
                f(p, rec)
        if done and policy in done:
            rep, run = done[policy]
        else:
            meter.start()
            rep, run = run_policy(policy, base, trajectories, store_root, aps=aps, slo=slo,
                                  on_turn=cb, block_tokens=block_tokens)
            other = meter.stop()
            rep.foreign_cores = None if other is None else round(other, 3)
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
            "slo": {"scale": slo.scale, "ttft_s": slo.ttft_limit, "tpot_s": slo.tpot_limit},
            "snic_source": "config" if calibration is None else "calibrated",
            "snic_calibration": None if calibration is None else calibration.to_dict()}
    info.update(setup or {})
    return BenchReport(info, reports)
