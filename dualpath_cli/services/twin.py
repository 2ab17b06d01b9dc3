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

The replay, the world's types and the calibration are sim/twin_replay.py's; the search over
settings (``dualpath tune suggest``) is sim/twin_search.py's. This module is where the twin
meets the outside: it turns a recording or a live decision log into the traffic, builds the
world (measuring this host with the runtime's reference model), and gives the cockpit its
predictor (:func:`cockpit_predictor`).

Engine groups: a cluster whose groups span ``cluster.nodes_per_group`` nodes (its view's
engines name their group by its first node, core/groups.py) replays with groups of that
many nodes (:func:`nodes_per_group_of`); a view whose groups are single nodes, as an older
recording's always are, replays with one node per group.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from dualpath_cli.errors import UsageError
from dualpath_cli.sim.twin_replay import (
    Measured,
    Setting,
    Traffic,
    World,
    fit_world,
    median_of,
    predict,
)
from dualpath_cli.sim.twin_search import proposed_setting
from dualpath_cli.telemetry.view import ClusterView, Decision

if TYPE_CHECKING:
    from dualpath_cli.sim import AgentPlan
    from dualpath_cli.telemetry.recording import Recording

__all__ = ["traffic_from_recording", "traffic_from_decisions", "world_for", "measure_compute",
           "measured_from_recording", "nodes_per_group_of", "cockpit_predictor",
           "host_compute", "forget_compute", "compute_path", "COMPUTE_FILE",
           "BLOCK_HEADER_BYTES", "PROBE_CAP", "mean_turn"]


#: Bytes of header in front of each stored block (storage/header.py): NIC bytes that are not
#: KV, so the embedded world's effective KV rate is the shaped rate x payload share.
BLOCK_HEADER_BYTES = 4096
#: The launch's fetch period (cli/launcher.py LAUNCH_DEFAULTS), the embedded world's.
EMBEDDED_FETCH_S = 0.005


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
    traffic = _traffic(view, plans_from_trajectories(
        trace.trajectories, trace.header.block_tokens, trace.header.outputs_stored),
        source, window_s)
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
                   nodes_per_group=nodes_per_group_of(view),
                   alpha_s_per_token=th.alpha_s_per_token)


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
    from dualpath_cli.services.recording_trace import recorded_starts, recorded_trace
    from dualpath_cli.sim import plans_from_trajectories

    trace = recorded_trace(rec, source)
    traffic = _traffic(view, plans_from_trajectories(
        trace.trajectories, trace.header.block_tokens, trace.header.outputs_stored),
        source, rec.window_s)
    measured = measured_from_recording(rec)
    starts = None if measured is None else recorded_starts(rec)
    if starts is not None and len(starts) != len(traffic.plans):
        starts = None  # a trace that is not the decisions' own: replay offline
    return replace(traffic, measured=measured, starts=starts,
                   block_tokens=_block_tokens(rec.decisions),
                   alpha_s_per_token=traffic.alpha_s_per_token or rec.alpha_s_per_token)


def measured_from_recording(rec: Recording) -> Measured | None:
    """The calibration evidence in ``rec`` (:class:`Measured`): its engines' busy seconds and
    the timings of its finished turns (stories of requests decided inside the window).

    ``None`` when the recording holds no story of a turn it served (an older recording, or
    one taken without them): then there is nothing per turn to fit.
    """
    gen: dict[int, int | None] = {d.rid: d.gen for d in rec.decisions
                                  if d.kind == "turn"}
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
    return Measured(len(rows), busy, median_of(decode), len(decode), median_of(gaps), len(gaps))


def world_for(traffic: Traffic, *, hardware: str | None = None,
              host_cores: int | None = None,
              measure: Callable[[str, int, int], dict[str, float]] | None = None,
              calibrate: bool = True) -> World:
    """The simulated world of ``traffic``'s cluster (module docstring).

    Args:
        hardware: profile world: the hardware profile (default hopper).
        host_cores: embedded world: cores the engines share (default: this machine's).
        measure: embedded world: ``(model, context, new) -> {"flops",
            "prefill_overhead_s", "decode_step_s"}`` at the traffic's mean turn (``context``
            tokens cached, ``new`` computed; default: :func:`host_compute`, measured once on
            this host per shape and kept, so that the same recording gives the same answer
            twice).
        calibrate: fit the world to what ``traffic`` measured (:func:`fit_world`) when it
            holds measurements.
    """
    world = _world(traffic, hardware, host_cores, measure)
    if calibrate and traffic.measured is not None:
        world = fit_world(traffic, world)
    return world


def _world(traffic: Traffic, hardware: str | None, host_cores: int | None,
           measure: Callable[[str, int, int], dict[str, float]] | None) -> World:
    from dualpath_cli.core.calibration import SimCalibration
    from dualpath_cli.core.profiles import get_hardware_profile, get_model_profile
    from dualpath_cli.core.reference_model import MODEL_CONFIGS

    cur = traffic.current
    if traffic.model not in MODEL_CONFIGS:
        model = get_model_profile(traffic.model)
        hw = get_hardware_profile(hardware or "hopper")
        cal = SimCalibration(quota_s=cur.quota_s, z_factor=traffic.z_factor)
        return World("profile", model, hw, cal)
    from dualpath_cli.config import load_config
    from dualpath_cli.core.calibration import calibrate_from_measurements

    cfg = load_config(overrides=[f"cluster.pd={traffic.pd}"]).config
    mc = MODEL_CONFIGS[traffic.model]
    model = mc.to_profile()
    context, new = mean_turn(traffic.plans)
    compute = (measure or host_compute)(traffic.model, context, new)
    bt = traffic.block_tokens or cfg.storage.block_size
    block = mc.n_layers * bt * mc.kv_bytes_per_token_layer
    notes = [f"compute measured here: {compute['flops'] / 1e9:.3g} GFLOP/s prefill "
             f"(the mean turn: {new} new tokens after {context}), "
             f"{compute['decode_step_s'] * 1e3:.3g} ms per decode step{_when(compute)}"]
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


def mean_turn(plans: Sequence[AgentPlan]) -> tuple[int, int]:
    """The traffic's mean turn: (context tokens before it, tokens it appends), the shape at
    which its prefill speed is measured (as ``dualpath bench`` probes it): the reference
    model computes long prompts faster per FLOP than short ones, so a fixed probe shape
    mispredicts traffic of another shape. Capped at :data:`PROBE_CAP` tokens each, to
    keep the probe short."""
    total = appended = n = 0
    for p in plans:
        ctx = 0
        for t in p.turns:
            total += ctx
            appended += max(1, t.append)
            n += 1
            ctx += t.append + t.gen
    n = max(1, n)
    return max(1, min(PROBE_CAP, total // n)), max(1, min(PROBE_CAP, appended // n))


def _when(compute: dict[str, float]) -> str:
    """When and under what load a kept measurement was taken (empty for one without)."""
    at, load = compute.get("taken_unix"), compute.get("load_average")
    if at is None:
        return ""
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))
    loaded = "" if load is None else f" at load average {load:.3g}"
    return f"; kept from {stamp}{loaded} (tune suggest --remeasure measures again)"


#: Longest context and append the compute probe uses (the decode step's context is
#: capped at 4,096): a bounded probe on a long-context trace.
PROBE_CAP = 16384
#: Where :func:`host_compute` keeps this host's measurements (in the state directory,
#: services/statefile.py: per user, gone with the runtime directory).
COMPUTE_FILE = "twin-compute.json"


def compute_path() -> Path:
    """The file of this host's kept compute measurements (:data:`COMPUTE_FILE`)."""
    from dualpath_cli.services.statefile import state_dir

    return state_dir() / COMPUTE_FILE


def host_compute(model: str, context: int, new: int) -> dict[str, float]:
    """:func:`measure_compute` of ``model`` at the turn shape (``context`` cached, ``new``
    computed), measured once on this host per shape and kept in :func:`compute_path`
    (``tune suggest --remeasure`` measures again), with when it was taken (``taken_unix``)
    and the load average then (``load_average``), which the world's notes show.

    Why: a fresh measurement on a loaded host moves by several percent from run to run, and
    every prediction with it; the twin answers the same twice only with the same compute.
    A kept one may be stale (taken under another load): the notes say when and under what
    load, and ``--remeasure`` replaces it; the twin never replaces it by itself.
    """
    from dualpath_cli.atomicio import atomic_write_text

    path = compute_path()
    key = f"{model}@{context}+{new}"
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        kept = {}
    if not isinstance(kept, dict):
        kept = {}
    got = kept.get(key)
    if isinstance(got, dict) and {"flops", "prefill_overhead_s", "decode_step_s"} <= set(got):
        return {k: float(v) for k, v in got.items() if isinstance(v, (int, float))}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    got = measure_compute(model, context, new)
    got["taken_unix"] = round(time.time(), 1)
    if load is not None:
        got["load_average"] = round(load, 2)
    kept[key] = got
    atomic_write_text(path, json.dumps(kept, indent=1, sort_keys=True) + "\n", mode=0o600)
    return got


def forget_compute() -> None:
    """Drop the kept measurements (the next world measures this host again)."""
    compute_path().unlink(missing_ok=True)


def measure_compute(model: str, context: int, new: int) -> dict[str, float]:
    """Prefill FLOP/s (of ``new`` tokens after ``context``), per-forward overhead and decode
    step of ``model`` on this machine (median of a few, as bench/validate_sim.py measures
    them)."""
    from dualpath_cli.runtime.calibrate import calibrate_flops_rate
    from dualpath_cli.runtime.model import load_model
    from dualpath_cli.runtime.model.threads import limit_blas_threads
    from dualpath_cli.runtime.model.timing import time_decode, time_prefill

    limit_blas_threads(1)
    ref = load_model(model)
    flops = calibrate_flops_rate(model, repeats=3, new=new, cached=context)
    overhead = sorted(time_prefill(ref, 1, 0, repeats=1) for _ in range(3))[1]
    decode = sorted(time_decode(ref, min(context, 4096), steps=2, repeats=1)
                    for _ in range(3))[1]
    return {"flops": flops, "prefill_overhead_s": overhead, "decode_step_s": decode}


#: ``predict(view, decisions, change) -> text``: the predicted effect of a change, worded.
CockpitPredictor = Callable[[ClusterView, Sequence[Decision], dict[str, str]], str]


def cockpit_predictor() -> CockpitPredictor:
    """The tuning twin's predicted-effect function for the TUI's tune dialog (the CLI hands
    it to the cockpit, which never imports the twin).

    It replays the decision log's served turns in the simulator under the settings in force
    and under the proposed ones (the twin's own world and units; this only words the
    outcome). It costs seconds of CPU (the embedded world measures this host's compute
    once per model and P/D), so the dialog runs it on request, in a worker thread.
    """
    worlds: dict[tuple[str, str], World] = {}

    def predict_change(view: ClusterView, decisions: Sequence[Decision],
                       change: dict[str, str]) -> str:
        traffic = traffic_from_decisions(view, decisions, "the cockpit's window")
        key = (traffic.model, traffic.pd)
        if key not in worlds:
            worlds[key] = world_for(traffic)
        world = worlds[key]
        proposed = proposed_setting(traffic, world, dict(change))
        before = predict(traffic, world, traffic.current)
        after = predict(traffic, world, proposed, "proposed")
        return (f"TTFT p90 {_s(before.ttft_p90_s)} -> {_s(after.ttft_p90_s)}, mean "
                f"{_s(before.ttft_mean_s)} -> {_s(after.ttft_mean_s)}; JCT "
                f"{_s(before.jct_s)} -> {_s(after.jct_s)}; storage NIC Max/Avg "
                f"{_r(before.snic_max_avg)} -> {_r(after.snic_max_avg)} "
                f"({traffic.turns} turns replayed, {world.kind} world)")

    return predict_change


def _s(seconds: float) -> str:
    return "n/a" if not math.isfinite(seconds) else f"{seconds:.3g} s"


def _r(ratio: float) -> str:
    return "n/a" if not math.isfinite(ratio) else f"{ratio:.2f}"
