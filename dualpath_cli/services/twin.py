"""The digital twin: replay a cluster's own served turns in the simulator and rank settings.

Why: an operator asks "what will alpha=X do to *my* traffic" before touching a running
cluster. The simulator runs the same core/ scheduler, so replaying the turns the cluster
served (a recording's trace, or the live decision log) with this cluster's P/D, model and
NIC rates predicts the JCT, TTFT and storage-NIC balance of each setting. ``dualpath tune
suggest`` and ``tune set --dry-run`` on a live cluster both come here; the CLI only renders.

What is replayed: every agent whose turns the decision log holds, each turn's prompt length
exactly (``recording.trace_from_decisions``), with the shared prefixes the cluster hit across
conversations (``recording.shared_links``). A recording with finished requests' stories
starts each agent when its first turn arrived in the recording (relative to the first: a
run whose agents all started together replays as one job); otherwise, and from a live
decision log, all agents start together (an offline replay). The JCT is from the first
arrival to the last finish; relative changes are what the ranking uses.

Two worlds:

* **embedded** (the view's model is a reference-model profile, ``tiny`` or ``bench``): the
  simulator is calibrated on this machine as ``bench/validate_sim.py`` does (the model's
  achieved prefill FLOP/s, per-forward overhead and decode step measured here, the view's
  storage-NIC rate less the block header, engines sharing this host's cores, whole-block
  hits), so predictions are of the embedded runtime on this host;
* **profile** (a model profile such as ``ds660b``): the simulator's model and hardware
  profiles as ``dualpath sim`` uses them (``--hardware``, default hopper).

Calibrated from the recording itself: a recording holds what the cluster measured while it
served these turns (each engine's busy fraction in every sample; each finished turn's story:
its arrival, TTFT and time per output token). The twin replays the recorded setting and
scales its compute model until the replay matches them (:func:`fit_world`): the prefill
engines' busy seconds fix the prefill speed (per FLOP and per forward), the decode engines'
the decode step, the turns' median first-to-last-token time a hand-off delay between the
engines, and the median gap between an agent's last token and its next request the client's
per-turn time. What the profile leaves out (this host's other processes, the engines' own
overheads, HTTP and polling) is then in the baseline and in every candidate alike. Only the
recorded setting is fitted; candidates are predictions. A live view (``--url``) or a
recording without stories is replayed uncalibrated.

Search: one dimension at a time around the settings in force (alpha, beta, the compute
quota, the read-side policy; with ``pd`` the P/D splits of the same node count), then the
best value of each dimension together; ranked by predicted JCT, unless the JCT cannot tell
the settings apart because the recorded arrivals set it (:func:`ranking_measure`): then by
the mean trajectory time (each agent from its own first arrival to its last token).

Engine groups: a cluster whose groups span ``cluster.nodes_per_group`` nodes (its view's
engines name their group by its first node, core/groups.py) replays with groups of that
many nodes (:func:`nodes_per_group_of`); a view whose groups are single nodes, as an older
recording's always are, replays with one node per group.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dualpath_cli.errors import UsageError

if TYPE_CHECKING:
    from dualpath_cli.core.profiles import HardwareProfile, ModelProfile
    from dualpath_cli.sim import AgentPlan, SimCalibration
    from dualpath_cli.sim.measured import TimedSimulation
    from dualpath_cli.telemetry.recording import Recording
    from dualpath_cli.telemetry.view import ClusterView, Decision

__all__ = ["Setting", "Traffic", "World", "Prediction", "Suggestion", "traffic_from_recording",
           "traffic_from_decisions", "world_for", "predict", "suggest", "READ_SIDES",
           "BLOCK_HEADER_BYTES", "MIN_GAIN", "proposed_setting", "candidates",
           "measure_compute", "Measured", "Fit", "measured_from_recording", "fit_world",
           "RANKINGS", "ranking_measure", "nodes_per_group_of"]

#: Read-side policies the search tries (core's policy names; the runtime takes them live).
READ_SIDES = ("dualpath", "round-robin", "split")
#: Bytes of header in front of each stored block (storage/header.py): NIC bytes that are not
#: KV, so the embedded world's effective KV rate is the shaped rate x payload share.
BLOCK_HEADER_BYTES = 4096
#: A setting must beat today's predicted JCT (or mean trajectory time, when that ranks) by
#: this fraction to be suggested (smaller differences are below what the simulator
#: resolves); a JCT that moves by less under every candidate does not tell them apart.
MIN_GAIN = 0.01
#: The measures :func:`suggest` ranks by (:func:`ranking_measure`) and how the table and the
#: JSON say which ranked.
RANKINGS = {"jct": "ranked by JCT",
            "mean_trajectory": "ranked by mean trajectory time: arrivals set the JCT"}
#: The launch's fetch period (cli/launch_cmd.py _LAUNCH_DEFAULTS), the embedded world's.
EMBEDDED_FETCH_S = 0.005
#: Most replays the calibration runs (it stops earlier once a round changes nothing by more
#: than :data:`FIT_TOLERANCE`).
FIT_ROUNDS = 8
#: A calibration round within this fraction of the last (and 1 ms for the delays) ends it.
FIT_TOLERANCE = 0.01
#: Bounds of a fitted compute scale: a replay that needs more is not this cluster's traffic.
FIT_SCALE_BOUNDS = (0.01, 100.0)


@dataclass(frozen=True, slots=True)
class Setting:
    """Scheduler settings a running cluster can take (scheduler units) and its P/D."""

    alpha: int
    beta: int
    quota_s: float
    read_side: str
    pd: str

    def key(self) -> tuple[Any, ...]:
        """Identity for de-duplication."""
        return (self.alpha, self.beta, round(self.quota_s, 6), self.read_side, self.pd)

    def patch(self) -> dict[str, Any]:
        """The PATCH /api/v1/scheduler body that applies it (P/D needs a relaunch)."""
        return {"alpha": self.alpha, "beta": self.beta, "quota": self.quota_s,
                "read_side": self.read_side}

    def command(self, current: Setting) -> str:
        """The ``dualpath tune set`` line that applies what differs from ``current``."""
        parts = []
        if self.alpha != current.alpha:
            parts.append(f"alpha={self.alpha}")
        if self.beta != current.beta:
            parts.append(f"beta={self.beta}")
        if not math.isclose(self.quota_s, current.quota_s):
            parts.append(f"quota={self.quota_s * 1e3:.4g}ms")
        if self.read_side != current.read_side:
            parts.append(f"read_side={self.read_side}")
        line = f"dualpath tune set {' '.join(parts)}" if parts else "(no change)"
        if self.pd != current.pd:
            line += f"  # and relaunch as {self.pd}"
        return line

    def to_dict(self) -> dict[str, Any]:
        """Plain form."""
        return {"alpha_tokens": self.alpha, "beta_tokens": self.beta,
                "quota_s": self.quota_s, "read_side": self.read_side, "pd": self.pd}


@dataclass(frozen=True)
class Traffic:
    """What the twin replays and the cluster it came from."""

    source: str
    model: str
    pd: str
    current: Setting
    z_factor: float
    plans: tuple[AgentPlan, ...]
    turns: int
    window_s: float
    snic_bytes_per_s: float | None
    measured: Measured | None = None
    starts: tuple[float, ...] | None = None  # per plan: its first arrival (None: all at 0)
    block_tokens: int | None = None  # the cluster's block size, when its lookups show it
    nodes_per_group: int = 1  # nodes an engine group spans (cluster.nodes_per_group)

    def to_dict(self) -> dict[str, Any]:
        """Plain form (no plans)."""
        return {"source": self.source, "model": self.model, "pd": self.pd,
                "nodes_per_group": self.nodes_per_group,
                "agents": len(self.plans), "turns": self.turns, "window_s": self.window_s,
                "snic_bytes_per_s": self.snic_bytes_per_s, "z_factor": self.z_factor,
                "current": self.current.to_dict(),
                "measured": None if self.measured is None else self.measured.to_dict()}


@dataclass(frozen=True)
class Measured:
    """What a recording measured while the cluster served the turns the twin replays.

    Attributes:
        turns: finished turns of the window with a story (TTFT, time per output token).
        busy_s: engine role (``prefill``, ``decode``) -> busy seconds over the window, summed
            over that role's engines (each sample's busy fraction x the time since the last
            sample); a role whose engines report no busy fraction is absent.
        decode_s: median first-to-last-token time of the multi-token turns (``tpot_s x (gen
            - 1)``); ``None`` when no turn generated more than one token.
        decode_turns: the turns ``decode_s`` is the median of.
        gap_s: median time from an agent's last token of a turn to its next request;
            ``None`` when no agent has two consecutive turns with stories.
        gaps: the gaps ``gap_s`` is the median of.
    """

    turns: int
    busy_s: dict[str, float]
    decode_s: float | None
    decode_turns: int
    gap_s: float | None
    gaps: int

    def to_dict(self) -> dict[str, Any]:
        """Plain form."""
        return {"turns": self.turns, "busy_s": dict(self.busy_s), "decode_s": self.decode_s,
                "decode_turns": self.decode_turns, "gap_s": self.gap_s, "gaps": self.gaps}


def _mean_positive(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return sum(got) / len(got) if got else None


def traffic_from_decisions(view: ClusterView, decisions: Sequence[Decision], source: str,
                           window_s: float = 0.0) -> Traffic:
    """The traffic in a decision log, on the cluster ``view`` shows.

    Raises:
        UsageError: no served turn in the log (nothing to replay).
    """
    from dualpath_cli.services.recording import trace_from_decisions
    from dualpath_cli.sim import plans_from_trajectories

    trace = trace_from_decisions(decisions)
    if trace is None:
        raise UsageError(f"{source}: no served turns to replay (the decision log is empty; "
                         "record while the cluster serves traffic)")
    traffic = _traffic(view, plans_from_trajectories(trace.trajectories), source, window_s)
    return replace(traffic, block_tokens=_block_tokens(decisions))


def _block_tokens(decisions: Sequence[Decision]) -> int | None:
    """The cluster's block size as its lookups show it (cached tokens over hit blocks of a
    turn that hit); ``None`` when no turn hit."""
    for d in decisions:
        hit = ((d.inputs or {}).get("lookup") or {}).get("hit_blocks")
        if isinstance(hit, int) and hit > 0 and d.cached > 0 and d.cached % hit == 0:
            return d.cached // hit
    return None


def _traffic(view: ClusterView, plans: list[AgentPlan], source: str,
             window_s: float) -> Traffic:
    th = view.scheduler.thresholds
    current = Setting(int(th.alpha_tokens), int(th.beta_tokens), float(th.quota_s),
                      th.read_side or view.scheduler.policy, view.pd)
    snic = _mean_positive([n.snic_bandwidth_bytes_per_s for n in view.nodes])
    return Traffic(source, view.model, view.pd, current, float(th.z_factor), tuple(plans),
                   sum(p.num_turns for p in plans), window_s, snic,
                   nodes_per_group=nodes_per_group_of(view))


def nodes_per_group_of(view: ClusterView) -> int:
    """The nodes an engine group of ``view``'s cluster spans (``cluster.nodes_per_group``):
    the most distinct nodes whose engines name one group of one role (a group is named by
    its first node, core/groups.py; the last group of a role may be shorter); 1 for a view
    without engines."""
    nodes: dict[tuple[str, int], set[int]] = {}
    for e in view.engines:
        nodes.setdefault((e.role, e.group), set()).add(e.node)
    return max((len(n) for n in nodes.values()), default=1)


def traffic_from_recording(rec: Recording, source: str) -> Traffic:
    """The served turns of a recording (its trace lines, else its decisions), on the
    cluster its last sample shows, with what the recording measured of them
    (:func:`measured_from_recording`; ``None`` without finished requests' stories).

    Raises:
        UsageError: a recording without samples or without served turns.
    """
    if not rec.samples:
        raise UsageError(f"{source}: the recording has no samples (no view of the cluster)")
    view = rec.samples[-1].view
    if rec.trace_lines:
        from dualpath_cli.sim import plans_from_trajectories
        from dualpath_cli.workload.trace_format import decode_lines

        trace = decode_lines((json.dumps(r) for r in rec.trace_lines), f"{source} (trace)")
        traffic = _traffic(view, plans_from_trajectories(trace.trajectories), source,
                           rec.window_s)
    else:
        traffic = traffic_from_decisions(view, rec.decisions, source, rec.window_s)
    measured = measured_from_recording(rec)
    starts = None if measured is None else _recorded_starts(rec)
    if starts is not None and len(starts) != len(traffic.plans):
        starts = None  # a trace that is not the decisions' own: replay offline
    return replace(traffic, measured=measured, starts=starts,
                   block_tokens=traffic.block_tokens or _block_tokens(rec.decisions))


def _recorded_starts(rec: Recording) -> tuple[float, ...]:
    """Per agent of the replay (the trace's order: agent ids sorted), the second its first
    turn arrived after the first agent's: the story's arrival, else the first turn's
    decision time; 0 for an agent whose first turn is not in the window."""
    first: dict[int, float] = {}
    agents: set[int] = set()
    rid_of: dict[int, int] = {}
    for d in rec.decisions:
        if getattr(d, "kind", "turn") != "turn":
            continue
        agents.add(d.agent)
        if d.turn == 0 and d.agent not in first:
            first[d.agent] = d.at
            rid_of[d.agent] = d.rid
    for agent, rid in rid_of.items():
        arrival = (rec.stories.get(rid) or {}).get("arrival")
        if isinstance(arrival, int | float) and math.isfinite(arrival):
            first[agent] = min(first[agent], float(arrival))
    t0 = min(first.values(), default=0.0)
    return tuple(first[a] - t0 if a in first else 0.0 for a in sorted(agents))


def _median(values: Sequence[float]) -> float | None:
    import statistics

    return statistics.median(values) if values else None


def measured_from_recording(rec: Recording) -> Measured | None:
    """The calibration evidence in ``rec`` (:class:`Measured`): its engines' busy seconds and
    the timings of its finished turns (stories of requests decided inside the window).

    ``None`` when the recording holds no story of a turn it served (an older recording, or
    one taken without them): then there is nothing per turn to fit.
    """
    gen: dict[int, int | None] = {d.rid: d.gen for d in rec.decisions
                                  if getattr(d, "kind", "turn") == "turn"}
    rows: list[tuple[int, int, float | None, float, float]] = []  # agent, turn, arrival...
    decode: list[float] = []
    for rid, story in rec.stories.items():
        ttft = story.get("ttft_s")
        if rid not in gen or ttft is None:
            continue
        g = gen[rid] or 1
        tpot = story.get("tpot_s")
        dec = tpot * (g - 1) if tpot is not None and g > 1 else 0.0
        if tpot is not None and g > 1:
            decode.append(dec)
        arrival = story.get("arrival")
        rows.append((int(story["agent"]), int(story["turn"]), arrival,
                     float(ttft), float(dec)))
    if not rows:
        return None
    rows.sort(key=lambda r: (r[0], r[1]))
    gaps = []
    for a, b in zip(rows, rows[1:], strict=False):
        if a[0] == b[0] and b[1] == a[1] + 1 and a[2] is not None and b[2] is not None:
            gaps.append(max(0.0, b[2] - (a[2] + a[3] + a[4])))
    busy: dict[str, float] = {}
    for prev, cur in zip(rec.samples, rec.samples[1:], strict=False):
        dt = cur.at - prev.at
        for e in cur.view.engines:
            if e.gpu_utilization is not None and dt > 0:
                busy[e.role] = busy.get(e.role, 0.0) + e.gpu_utilization * dt
    return Measured(len(rows), busy, _median(decode), len(decode), _median(gaps), len(gaps))


# --- the simulated world ---------------------------------------------------------------------
@dataclass(frozen=True)
class World:
    """How a setting becomes a simulator setup: profiles and calibration."""

    kind: str                     # "embedded" or "profile"
    model: ModelProfile
    hardware: HardwareProfile
    calibration: SimCalibration
    notes: tuple[str, ...] = ()
    turn_gap_s: float = 0.0       # client time between an agent's turns (fitted)
    handoff_s: float = 0.0        # first token to the DE taking the turn, beyond the model
    fit: Fit | None = None        # what was fitted from the recording (None: not calibrated)

    def to_dict(self) -> dict[str, Any]:
        """Plain form."""
        c = self.calibration
        return {"kind": self.kind, "model": self.model.name, "hardware": self.hardware.name,
                "host_cores": c.host_cores, "block_tokens": c.block_tokens,
                "fetch_period_s": c.fetch_period_s, "notes": list(self.notes),
                "calibration": None if self.fit is None else self.fit.to_dict()}


@dataclass(frozen=True)
class Fit:
    """The twin's calibration from a recording (:func:`fit_world`).

    ``prefill_scale`` multiplies the modelled prefill time (FLOPs at the achieved rate and
    the per-forward overhead), ``decode_scale`` the decode step (``None``: not fitted, with
    the reason in ``unfitted``); ``handoff_s`` and ``turn_gap_s`` are the delays added per
    turn; ``replayed_busy_s``/``replayed_jct_s`` what the calibrated replay of the recorded
    setting gives, beside ``measured``.
    """

    measured: Measured
    prefill_scale: float | None
    decode_scale: float | None
    handoff_s: float
    turn_gap_s: float
    replayed_busy_s: dict[str, float]
    replayed_jct_s: float
    rounds: int
    settled: bool = True
    unfitted: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain form."""
        return {"measured": self.measured.to_dict(), "prefill_scale": self.prefill_scale,
                "decode_scale": self.decode_scale, "handoff_s": self.handoff_s,
                "turn_gap_s": self.turn_gap_s, "replayed_busy_s": dict(self.replayed_busy_s),
                "replayed_jct_s": self.replayed_jct_s, "rounds": self.rounds,
                "settled": self.settled, "unfitted": list(self.unfitted)}

    def note(self) -> str:
        """One line for ``tune suggest``: what was fitted, from how many turns."""
        m = self.measured
        parts = []
        busy = self.replayed_busy_s
        if self.prefill_scale is not None:
            parts.append(f"prefill x{self.prefill_scale:.3g} (prefill engines busy "
                         f"{m.busy_s.get('prefill', 0.0):.1f} s measured, "
                         f"{busy.get('prefill', 0.0):.1f} s replayed)")
        if self.decode_scale is not None:
            parts.append(f"decode step x{self.decode_scale:.3g} (decode engines busy "
                         f"{m.busy_s.get('decode', 0.0):.1f} s measured, "
                         f"{busy.get('decode', 0.0):.1f} s replayed)")
        if m.decode_s is not None:
            parts.append(f"hand-off {self.handoff_s * 1e3:.3g} ms per turn (first to last "
                         f"token {m.decode_s * 1e3:.3g} ms median of {m.decode_turns} turns)")
        if m.gap_s is not None:
            parts.append(f"client gap {self.turn_gap_s * 1e3:.3g} ms between turns (median "
                         f"of {m.gaps})")
        line = (f"calibrated from the recording's {m.turns} served turns in {self.rounds} "
                f"replays{'' if self.settled else ' (not settled: the last is used)'}: "
                + "; ".join(parts or ["nothing to fit"]))
        if self.unfitted:
            line += "; not fitted: " + "; ".join(self.unfitted)
        return line + "."


def world_for(traffic: Traffic, *, hardware: str | None = None,
              host_cores: int | None = None,
              measure: Callable[[str, int], dict[str, float]] | None = None,
              calibrate: bool = True) -> World:
    """The simulated world of ``traffic``'s cluster (module docstring).

    Args:
        hardware: profile world: the hardware profile (default hopper).
        host_cores: embedded world: cores the engines share (default: this machine's).
        measure: embedded world: ``(model, context) -> {"flops", "prefill_overhead_s",
            "decode_step_s"}`` (default: measured now with the reference model).
        calibrate: fit the world to what ``traffic`` measured (:func:`fit_world`) when it
            holds measurements.
    """
    world = _world(traffic, hardware, host_cores, measure)
    if calibrate and traffic.measured is not None:
        world = fit_world(traffic, world)
    return world


def _world(traffic: Traffic, hardware: str | None, host_cores: int | None,
           measure: Callable[[str, int], dict[str, float]] | None) -> World:
    from dualpath_cli.core.profiles import get_hardware_profile, get_model_profile
    from dualpath_cli.runtime.model import MODEL_CONFIGS
    from dualpath_cli.sim import SimCalibration

    cur = traffic.current
    if traffic.model not in MODEL_CONFIGS:
        model = get_model_profile(traffic.model)
        hw = get_hardware_profile(hardware or "hopper")
        cal = SimCalibration(quota_s=cur.quota_s, z_factor=traffic.z_factor)
        return World("profile", model, hw, cal)
    from dualpath_cli.config import load_config
    from dualpath_cli.sim import calibrate_from_measurements

    cfg = load_config(overrides=[f"cluster.pd={traffic.pd}"]).config
    mc = MODEL_CONFIGS[traffic.model]
    model = mc.to_profile()
    context = _mean_context(traffic.plans)
    compute = (measure or measure_compute)(traffic.model, context)
    bt = traffic.block_tokens or cfg.storage.block_size
    block = mc.n_layers * bt * mc.kv_bytes_per_token_layer
    notes = [f"compute measured here: {compute['flops'] / 1e9:.3g} GFLOP/s prefill, "
             f"{compute['decode_step_s'] * 1e3:.3g} ms per decode step"]
    snic = traffic.snic_bytes_per_s
    if snic is None:
        notes.append("the cluster's storage NICs are unshaped: reads modelled at the "
                     "config's rate")
        snic = cfg.hardware.node_read_bandwidth
    cores = host_cores if host_cores is not None else (os.cpu_count() or 1)
    hw, cal = calibrate_from_measurements(
        cfg.hardware_profile, achieved_flops=compute["flops"],
        decode_step_s=compute["decode_step_s"],
        snic_rate=snic * block / (block + BLOCK_HEADER_BYTES),
        cnic_rate=cfg.hardware.cnic_bandwidth if cfg.hardware.cnic_bandwidth > 0 else None,
        base=SimCalibration(cnic_model_share=0.0, hbm_reserve=0.0,
                            fetch_period_s=EMBEDDED_FETCH_S, quota_s=cur.quota_s,
                            block_tokens=bt, z_factor=traffic.z_factor,
                            prefill_overhead_s=compute["prefill_overhead_s"],
                            full_blocks_only=True, host_cores=cores,
                            overhead_per_request=True))
    return World("embedded", model, hw, cal, tuple(notes))


def _mean_context(plans: Sequence[AgentPlan]) -> int:
    total = n = 0
    for p in plans:
        ctx = 0
        for t in p.turns:
            total += ctx
            n += 1
            ctx += t.append + t.gen
    return max(1, total // max(1, n))


def measure_compute(model: str, context: int) -> dict[str, float]:
    """Prefill FLOP/s, per-forward overhead and decode step of ``model`` on this machine
    (median of a few, as bench/validate_sim.py measures them)."""
    from dualpath_cli.runtime.calibrate import calibrate_flops_rate
    from dualpath_cli.runtime.model import load_model
    from dualpath_cli.runtime.model.threads import limit_blas_threads
    from dualpath_cli.runtime.model.timing import time_decode, time_prefill

    limit_blas_threads(1)
    ref = load_model(model)
    flops = calibrate_flops_rate(model, repeats=3)
    overhead = sorted(time_prefill(ref, 1, 0, repeats=1) for _ in range(3))[1]
    decode = sorted(time_decode(ref, min(context, 4096), steps=2, repeats=1)
                    for _ in range(3))[1]
    return {"flops": flops, "prefill_overhead_s": overhead, "decode_step_s": decode}


# --- predictions -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Prediction:
    """The simulator's outcome for one setting on the replayed traffic."""

    setting: Setting
    jct_s: float
    mean_trajectory_s: float
    ttft_mean_s: float
    ttft_p90_s: float
    snic_max_avg: float
    wall_s: float
    dimension: str = "current"
    cross_hit_share: float = 0.0  # hit tokens another conversation's shared prefix gave

    def to_dict(self) -> dict[str, Any]:
        """Plain form."""
        return {**self.setting.to_dict(), "jct_s": self.jct_s,
                "mean_trajectory_s": self.mean_trajectory_s, "ttft_mean_s": self.ttft_mean_s,
                "ttft_p90_s": self.ttft_p90_s, "snic_max_avg": self.snic_max_avg,
                "cross_conversation_hit_share": self.cross_hit_share,
                "wall_s": self.wall_s, "varied": self.dimension}


def _simulation(traffic: Traffic, world: World, setting: Setting,
                keep_phases: bool = False) -> TimedSimulation:
    """The replay of ``traffic`` under ``setting`` in ``world``, built, not run."""
    from dualpath_cli.sim import make_setup
    from dualpath_cli.sim.measured import TimedSimulation

    if setting.beta < world.calibration.block_tokens:
        raise UsageError(f"beta {setting.beta} tokens is below one block "
                         f"({world.calibration.block_tokens} tokens)")
    cal = replace(world.calibration, quota_s=setting.quota_s)
    setup = make_setup(world.model.name if world.kind == "profile" else "ds660b",
                       setting.pd, setting.read_side, "hopper", calibration=cal,
                       alpha=setting.alpha, beta=setting.beta,
                       nodes_per_group=traffic.nodes_per_group)
    setup = replace(setup, model=world.model, hardware=world.hardware)
    return TimedSimulation(setup, list(traffic.plans), starts=traffic.starts,
                           turn_gap_s=world.turn_gap_s, handoff_s=world.handoff_s,
                           keep_phases=keep_phases)


def _scaled_world(world: World, prefill: float, decode: float, handoff_s: float,
            turn_gap_s: float) -> World:
    """``world`` with its prefill time x ``prefill``, decode step x ``decode`` and the
    per-turn delays set."""
    hw = replace(world.hardware, gpu_peak_flops=world.hardware.gpu_peak_flops / prefill)
    cal = world.calibration
    cal = replace(cal, prefill_overhead_s=cal.prefill_overhead_s * prefill,
                  decode_step_s=None if cal.decode_step_s is None
                  else cal.decode_step_s * decode)
    return replace(world, hardware=hw, calibration=cal, handoff_s=handoff_s,
                   turn_gap_s=turn_gap_s)


def _bounded(scale: float) -> float:
    lo, hi = FIT_SCALE_BOUNDS
    return min(hi, max(lo, scale))


def fit_world(traffic: Traffic, world: World) -> World:
    """``world`` calibrated to what ``traffic`` measured (module docstring), with the
    :class:`Fit` and its note.

    Each round replays the recorded setting and moves each fitted quantity by what the
    replay missed, in two stages of at most :data:`FIT_ROUNDS` replays each, until a round
    changes nothing by more than :data:`FIT_TOLERANCE`: first each role's compute scale by
    measured / replayed busy seconds (busy time is compute, this host's sharing of cores
    included, so the ratio is the speed the model lacks), then the hand-off delay by the
    measured minus replayed median first-to-last-token time; the client gap is measured
    directly. The replayed figures reported are the last replay's (all fitted values).
    """
    m = traffic.measured
    if m is None:
        return world
    unfitted = []
    busy_pe, busy_de = m.busy_s.get("prefill"), m.busy_s.get("decode")
    if not busy_pe:
        unfitted.append("prefill speed (the prefill engines report no busy time)")
    fit_decode = bool(busy_de) and world.calibration.decode_step_s is not None
    if not fit_decode:
        unfitted.append("decode step (" + ("the decode engines report no busy time"
                                          if not busy_de else "a roofline decode model")
                        + ")")
    gap = m.gap_s or 0.0
    prefill = decode = 1.0
    handoff = 0.0
    rounds = 0
    replayed: dict[str, float] = {"prefill": 0.0, "decode": 0.0}
    jct = math.nan
    settled = True

    def replay() -> TimedSimulation:
        nonlocal rounds, jct
        rounds += 1
        sim = _simulation(traffic, _scaled_world(world, prefill, decode, handoff, gap),
                          traffic.current, keep_phases=True)
        jct = sim.run_offline().jct
        replayed["prefill"] = sum(p.busy_time for p in sim.pes)
        replayed["decode"] = sum(d.busy_time for d in sim.des)
        return sim

    # stage 1: the compute scales (busy time), no hand-off: a decode engine's busy time
    # depends on which turns overlap in its batch, which the hand-off moves
    for i in range(FIT_ROUNDS):
        replay()
        new_p = (_bounded(prefill * busy_pe / replayed["prefill"])
                 if busy_pe and replayed["prefill"] > 0 else prefill)
        new_d = (_bounded(decode * busy_de / replayed["decode"])
                 if fit_decode and busy_de and replayed["decode"] > 0 else decode)
        done = (abs(new_p / prefill - 1) <= FIT_TOLERANCE
                and abs(new_d / decode - 1) <= FIT_TOLERANCE)
        if done or i == FIT_ROUNDS - 1:
            settled = done
            break
        prefill, decode = new_p, new_d
    # stage 2: the hand-off (first to last token beyond the modelled decode), scales fixed
    if m.decode_s is not None:
        for i in range(FIT_ROUNDS):
            sim_decode = _median([p.decode_s for p in replay().phases if p.gen > 1])
            if sim_decode is None:
                break
            new_h = max(0.0, handoff + m.decode_s - sim_decode)
            if abs(new_h - handoff) <= 1e-3:
                break
            if i == FIT_ROUNDS - 1:
                settled = False
                break
            handoff = new_h
    for role, name in (("prefill", "prefill speed"), ("decode", "decode step")):
        if m.busy_s.get(role) and not replayed.get(role):
            unfitted.append(f"{name} (the replay keeps those engines idle)")
    fitted_p = bool(busy_pe) and replayed["prefill"] > 0
    fitted_d = fit_decode and replayed["decode"] > 0
    fit = Fit(m, prefill if fitted_p else None, decode if fitted_d else None, handoff, gap,
              replayed, jct, rounds, settled, tuple(unfitted))
    out = _scaled_world(world, prefill, decode, handoff, gap)
    return replace(out, fit=fit, notes=(*world.notes, fit.note()))


def predict(traffic: Traffic, world: World, setting: Setting,
            dimension: str = "current") -> Prediction:
    """Replay ``traffic`` under ``setting`` (offline: every agent starts at t = 0).

    Raises:
        UsageError: a setting the simulator refuses (e.g. beta below one block), named.
    """
    from dualpath_cli.sim.metrics import latency_stats

    sim = _simulation(traffic, world, setting)
    sim.record = True  # TTFT samples of every turn, as an online run keeps them
    t0 = time.perf_counter()
    res = sim.run_offline()
    wall = time.perf_counter() - t0
    ttft = latency_stats([s[1] for s in sim.samples]) if sim.samples else None
    nan = float("nan")
    return Prediction(setting, res.jct, float(res.extra.get("mean_trajectory_s", nan)),
                      ttft.mean if ttft else nan, ttft.p90 if ttft else nan,
                      res.snic_max_avg, wall, dimension, res.cross_conversation_hit_share)


# --- the search ------------------------------------------------------------------------------
def _scaled(value: int, factors: Sequence[float], low: int) -> list[int]:
    out = []
    for f in factors:
        v = max(low, round(value * f))
        if v not in out and v != value:
            out.append(v)
    return out


def _pd_splits(pd: str, hw: HardwareProfile | None = None) -> list[str]:
    """Other P/D splits of the same node count (at least one of each role), within the
    bottleneck-free P/D range of ``hw`` (core/capacity.py, equation 9) when it has one; a
    node type with no bottleneck-free ratio (or unknown NIC rates) keeps every split."""
    from dualpath_cli.config.model import parse_pd
    from dualpath_cli.core.capacity import pd_ratio_range, storage_ratio

    spec = parse_pd(pd)
    total = spec.prefill_nodes + spec.decode_nodes
    splits = [(p, total - p) for p in range(1, total) if p != spec.prefill_nodes]
    if hw is not None and min(hw.snic_bandwidth, hw.cnic_bandwidth, hw.dram_bandwidth) > 0:
        bounds = pd_ratio_range(hw.gpus_per_node, storage_ratio(
            hw.snics_per_node, hw.snic_bandwidth, hw.cnic_bandwidth), hw.cnic_bandwidth,
            hw.dram_bandwidth)
        inside = [(p, d) for p, d in splits if bounds.contains(p / d)]
        if bounds.feasible and inside:
            splits = inside
    return [f"{p}P{d}D" for p, d in splits]


def candidates(traffic: Traffic, world: World, *, pd: bool | Sequence[str] = False
               ) -> list[tuple[str, Setting]]:
    """Settings tried one dimension at a time around the current one, with the varied name.

    ``pd``: True tries the other splits of the same node count (:func:`_pd_splits`); a list
    of P/D strings tries exactly those (today's left out).

    Alpha also tries the paper's window rule for this world (tokens the storage NIC reads
    in 3 s), which a cluster launched with a poor alpha may be far from.
    """
    from dualpath_cli.core.thresholds import tokens_readable

    cur = traffic.current
    bt = world.calibration.block_tokens
    kvpt = world.model.kv_bytes_per_token
    snic = world.hardware.snic_bandwidth * world.hardware.snics_per_node
    paper_alpha = tokens_readable(snic, kvpt, world.calibration.alpha_window_s) if kvpt else 0
    out: list[tuple[str, Setting]] = []
    alphas = _scaled(cur.alpha, (0.0, 0.25, 4.0), 0)
    if paper_alpha and paper_alpha not in alphas and paper_alpha != cur.alpha:
        alphas.append(paper_alpha)
    out += [("alpha", replace(cur, alpha=a)) for a in alphas]
    out += [("beta", replace(cur, beta=b)) for b in _scaled(cur.beta, (0.25, 0.5, 2.0, 4.0), bt)]
    out += [("quota", replace(cur, quota_s=cur.quota_s * f)) for f in (0.5, 2.0)]
    out += [("read_side", replace(cur, read_side=r)) for r in READ_SIDES if r != cur.read_side]
    if pd:
        splits = (_pd_splits(cur.pd, world.hardware if world.kind == "profile" else None)
                  if pd is True else [x for x in pd if x != cur.pd])
        out += [("pd", replace(cur, pd=x)) for x in splits]
    return out


def _score(p: Prediction, ranked_by: str) -> float:
    """``p``'s value of the ranking measure (lower is better; not finite: last)."""
    v = p.jct_s if ranked_by == "jct" else p.mean_trajectory_s
    return v if math.isfinite(v) else math.inf


def ranking_measure(traffic: Traffic, current: Prediction,
                    predictions: Sequence[Prediction]) -> str:
    """The measure that ranks ``predictions`` against today's (a key of :data:`RANKINGS`).

    ``"jct"``, unless the JCT cannot tell the settings apart because the recorded arrivals
    set it: the replay starts agents at their recorded first arrivals, and no candidate's
    predicted JCT differs from today's by more than :data:`MIN_GAIN` (the last agent arrives
    late in the window and the job ends a trajectory after it, whatever the setting). Then
    ``"mean_trajectory"``: each agent's time from its own first arrival to its last token,
    which the settings still move. A candidate whose JCT moves beyond the noise, better or
    worse, says the JCT discriminates (a recording whose work outlasts its arrivals); an
    offline replay (all agents at t = 0) is one job, ranked by its JCT.
    """
    if (not traffic.starts or max(traffic.starts) <= 0
            or not math.isfinite(current.mean_trajectory_s)
            or not math.isfinite(current.jct_s) or current.jct_s <= 0):
        return "jct"
    for p in predictions:
        if p is not current and math.isfinite(p.jct_s) and (
                abs(p.jct_s - current.jct_s) > MIN_GAIN * current.jct_s):
            return "jct"
    return "mean_trajectory"


@dataclass
class Suggestion:
    """The ranked predictions (best first), today's, and what was searched.

    ``ranked_by``: the measure that ranked them (a key of :data:`RANKINGS`,
    :func:`ranking_measure`); the best beats today's on it by :data:`MIN_GAIN`, else it is
    today's.
    """

    traffic: Traffic
    world: World
    current: Prediction
    ranked: list[Prediction]
    wall_s: float
    skipped: list[str] = field(default_factory=list)
    ranked_by: str = "jct"

    @property
    def best(self) -> Prediction:
        """The best setting found (may be the current one)."""
        return self.ranked[0]

    @property
    def ranking(self) -> str:
        """Which measure ranked, in words (``ranked by JCT``, ...)."""
        return RANKINGS[self.ranked_by]

    def change(self, p: Prediction) -> float:
        """Predicted relative JCT change of ``p`` against today's."""
        return (p.jct_s - self.current.jct_s) / self.current.jct_s

    def trajectory_change(self, p: Prediction) -> float:
        """Predicted relative change of ``p``'s mean trajectory time against today's (NaN
        when today's is not known)."""
        now = self.current.mean_trajectory_s
        return (p.mean_trajectory_s - now) / now if now > 0 else math.nan

    def gain(self, p: Prediction) -> float:
        """Predicted relative change of the ranking measure (``ranked_by``) of ``p``."""
        return self.change(p) if self.ranked_by == "jct" else self.trajectory_change(p)

    def best_by_dimension(self) -> dict[str, Prediction]:
        """Per varied dimension (``alpha``, ``beta``, ...), its best replay, today's excluded.

        Why: the overall best may change another knob (a read rule that makes alpha moot);
        an operator asking "what alpha?" wants the best that varies alpha alone.
        """
        out: dict[str, Prediction] = {}
        for p in self.ranked:  # best first: the first of each dimension is its best
            if p is not self.current and p.dimension not in out:
                out[p.dimension] = p
        return out

    def _entry(self, p: Prediction) -> dict[str, Any]:
        return {**p.to_dict(), "jct_change": self.change(p),
                "mean_trajectory_change": self.trajectory_change(p),
                "command": p.setting.command(self.traffic.current)}

    def to_dict(self, top: int = 3) -> dict[str, Any]:
        """Plain form (``--json``)."""
        return {"traffic": self.traffic.to_dict(), "world": self.world.to_dict(),
                "ranked_by": self.ranked_by, "ranking": self.ranking,
                "current": self.current.to_dict(),
                "best": [self._entry(p) for p in self.ranked[:top]],
                "by_dimension": {d: self._entry(p)
                                 for d, p in self.best_by_dimension().items()},
                "searched": len(self.ranked), "skipped": self.skipped, "wall_s": self.wall_s}


def _predict_job(args: tuple[Traffic, World, Setting, str]) -> Prediction | str:
    """One replay in a worker process (a refused setting comes back as its message)."""
    try:
        return predict(*args)
    except UsageError as err:
        return str(err)


def suggest(traffic: Traffic, world: World, *, pd: bool | Sequence[str] = False,
            budget_s: float = 50.0,
            workers: int | None = None,
            on_result: Callable[[Prediction], None] | None = None) -> Suggestion:
    """Search settings for ``traffic`` (module docstring) within about ``budget_s``.

    Today's setting and each dimension's candidates are independent replays, run on
    ``workers`` processes (default: this machine's cores; 1, or a caller with other threads
    running, runs them here); then the
    combination of each dimension's best. Once ``budget_s`` is spent, replays not yet
    started are skipped and listed. Ranked by the measure :func:`ranking_measure` picks
    from the one-dimension replays (the JCT, or the mean trajectory time when arrivals set
    the JCT); the best must beat today's on it by :data:`MIN_GAIN`.
    """
    t0 = time.perf_counter()
    done: dict[tuple[Any, ...], Prediction] = {}
    skipped: list[str] = []
    jobs = [("current", traffic.current)]
    for dim, st in candidates(traffic, world, pd=pd):
        if st.key() not in {j[1].key() for j in jobs}:
            jobs.append((dim, st))

    def keep(dim: str, st: Setting, got: Prediction | str) -> None:
        if isinstance(got, str):
            skipped.append(f"{dim}: {got}")
            return
        done[st.key()] = got
        if on_result is not None and dim != "current":
            on_result(got)

    n = workers if workers is not None else min(len(jobs), os.cpu_count() or 1)
    if n > 1 and threading.active_count() > 1:
        n = 1  # forking a process with other threads (a served cluster) can deadlock the child
    if n <= 1:
        for dim, st in jobs:
            if dim != "current" and time.perf_counter() - t0 > budget_s:
                skipped.append(f"{dim}: over the budget: {st.to_dict()}")
                continue
            keep(dim, st, _predict_job((traffic, world, st, dim)))
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(n, mp_context=mp.get_context("fork")) as pool:
            futures = [(dim, st, pool.submit(_predict_job, (traffic, world, st, dim)))
                       for dim, st in jobs]
            for dim, st, fut in futures:
                if dim != "current" and time.perf_counter() - t0 > budget_s and fut.cancel():
                    skipped.append(f"{dim}: over the budget: {st.to_dict()}")
                    continue
                keep(dim, st, fut.result())
    if traffic.current.key() not in done:
        raise UsageError(f"today's setting cannot be replayed: {skipped[0]}")
    current = done[traffic.current.key()]

    def run(dim: str, st: Setting) -> None:
        if st.key() in done:
            return
        if time.perf_counter() - t0 > budget_s:
            skipped.append(f"{dim}: over the budget: {st.to_dict()}")
            return
        keep(dim, st, _predict_job((traffic, world, st, dim)))

    ranked_by = ranking_measure(traffic, current, list(done.values()))

    def score(p: Prediction) -> float:
        return _score(p, ranked_by)

    best_by_dim: dict[str, Prediction] = {}
    for p in done.values():
        if p.dimension != "current" and score(p) < score(current) and (
                p.dimension not in best_by_dim or score(p) < score(best_by_dim[p.dimension])):
            best_by_dim[p.dimension] = p
    if len(best_by_dim) > 1:
        combo = traffic.current
        for dim, p in best_by_dim.items():
            attr = "quota_s" if dim == "quota" else dim
            combo = replace(combo, **{attr: getattr(p.setting, attr)})
        run("combined", combo)
    ranked = sorted(done.values(), key=lambda p: (score(p), p.ttft_mean_s
                                                  if math.isfinite(p.ttft_mean_s) else 0.0))
    if ranked[0] is not current and score(ranked[0]) > score(current) * (1 - MIN_GAIN):
        ranked.remove(current)  # within the noise of the model: keep what is in force
        ranked.insert(0, current)
    return Suggestion(traffic, world, current, ranked, time.perf_counter() - t0, skipped,
                      ranked_by)


def proposed_setting(traffic: Traffic, world: World, body: dict[str, Any]) -> Setting:
    """``traffic``'s current setting with a PATCH body's values (CLI units) applied, in
    scheduler units as the running cluster would resolve them (api/control.py's rules:
    alpha in tokens, bytes or seconds of reading; beta in tokens; the quota as time).

    Raises:
        UsageError: a value the running scheduler would refuse, with the reason.
    """
    from dualpath_cli.config.quantities import parse_alpha, parse_beta, parse_quota
    from dualpath_cli.core.thresholds import bytes_to_tokens, tokens_readable

    cur = traffic.current
    out = cur
    kvpt = world.model.kv_bytes_per_token
    if "alpha" in body:
        t = parse_alpha(body["alpha"])
        if t.form == "tokens":
            alpha = int(t.amount)
        elif t.form == "bytes":
            alpha = bytes_to_tokens(t.amount, kvpt)
        else:
            snic = traffic.snic_bytes_per_s
            if not snic:
                raise UsageError(f"alpha {body['alpha']!r}: seconds of reading need the "
                                 "storage-NIC bandwidth, and this cluster's is unshaped")
            alpha = tokens_readable(snic, kvpt, t.amount)
        out = replace(out, alpha=alpha)
    if "beta" in body:
        t = parse_beta(body["beta"])
        if t.form != "tokens":
            raise UsageError(f"beta {body['beta']!r}: the running scheduler takes beta in "
                             "tokens (1M, 800000)")
        out = replace(out, beta=int(t.amount))
    if "quota" in body:
        t = parse_quota(body["quota"])
        if t.form == "flops":
            raise UsageError(f"quota {body['quota']!r}: give the quota as time (300ms)")
        out = replace(out, quota_s=float(t.amount))
    if "read_side" in body:
        out = replace(out, read_side=str(body["read_side"]))
    return out
