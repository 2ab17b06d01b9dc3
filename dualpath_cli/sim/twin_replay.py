"""The twin's replay: a setting, the traffic it replays, the simulated world, and the fit.

Why in sim/: replaying a cluster's served turns under a setting is simulator work over plain
data (the agents' plans, the profiles, the calibration), so it lives beside the simulator
and imports nothing above it. Where the traffic comes from (a recording, a live decision
log) and how the embedded world measures this host are services/twin.py's; the search over
settings is sim/twin_search.py's.

Calibrated from the recording itself (:func:`fit_world`): the twin replays the recorded
setting and scales its compute model until the replay matches what the cluster measured:
the prefill engines' busy seconds fix the prefill speed (per FLOP and per forward), the
decode engines' the decode step, the turns' median first-to-last-token time a hand-off delay
between the engines, and the median gap between an agent's last token and its next request
the client's per-turn time. Only the recorded setting is fitted; candidates are predictions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dualpath_cli.errors import UsageError

if TYPE_CHECKING:
    from dualpath_cli.core.calibration import SimCalibration
    from dualpath_cli.core.profiles import HardwareProfile, ModelProfile
    from dualpath_cli.sim import AgentPlan
    from dualpath_cli.sim.measured import TimedSimulation

__all__ = ["Setting", "Traffic", "Measured", "World", "Fit", "Prediction", "fit_world",
           "predict", "replicate", "median_of", "REPLICATE_COMPUTE",
           "REPLICATE_ARRIVAL", "FIT_ROUNDS", "FIT_TOLERANCE", "FIT_SCALE_BOUNDS"]


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

    def command(self, current: Setting, nodes_per_group: int = 1) -> str | None:
        """The line that applies this setting where the cluster runs ``current``, as it runs
        when pasted: ``dualpath tune set`` with what differs (alpha and beta in tokens, the
        scheduler's units, so nothing is rounded on the way); for another P/D the
        ``dualpath launch`` line that relaunches with every threshold of the setting (a
        relaunch reads the config, not what was set live). ``None``: nothing to apply."""
        if self.pd != current.pd:
            sets = [f"scheduler.alpha={self.alpha}", f"scheduler.beta={self.beta}",
                    f"scheduler.compute_quota={_ms(self.quota_s)}",
                    f"scheduler.read_side={self.read_side}"]
            if nodes_per_group > 1:
                sets.append(f"cluster.nodes_per_group={nodes_per_group}")
            return f"dualpath launch --pd {self.pd} " + " ".join(f"--set {x}" for x in sets)
        parts = []
        if self.alpha != current.alpha:
            parts.append(f"alpha={self.alpha}")
        if self.beta != current.beta:
            parts.append(f"beta={self.beta}")
        if not math.isclose(self.quota_s, current.quota_s):
            parts.append(f"compute_quota={_ms(self.quota_s)}")
        if self.read_side != current.read_side:
            parts.append(f"read_side={self.read_side}")
        return f"dualpath tune set {' '.join(parts)}" if parts else None

    def to_dict(self) -> dict[str, Any]:
        """Plain form."""
        return {"alpha_tokens": self.alpha, "beta_tokens": self.beta,
                "quota_s": self.quota_s, "read_side": self.read_side, "pd": self.pd}


def _ms(seconds: float) -> str:
    """A quota as ``tune set``/``--set`` take it (milliseconds)."""
    return f"{seconds * 1e3:.6g}ms"


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
    #: seconds of reading one alpha token stands for, as the cluster's status gives alpha
    #: (``alpha_s / alpha_tokens``); None where the cluster did not say (alpha in tokens)
    alpha_s_per_token: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain form (no plans)."""
        return {"source": self.source, "model": self.model, "pd": self.pd,
                "nodes_per_group": self.nodes_per_group,
                "alpha_s_per_token": self.alpha_s_per_token,
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


def median_of(values: Sequence[float]) -> float | None:
    """The median of ``values`` (``None`` when there are none)."""
    return statistics.median(values) if values else None


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
    dimension: str = "current"
    cross_hit_share: float = 0.0  # hit tokens another conversation's shared prefix gave
    #: (JCT, mean trajectory time) of each replicate replay (:func:`predict` with a seed):
    #: the same setting with arrivals and compute perturbed, for the uncertainty band
    replicates: tuple[tuple[float, float], ...] = ()
    hit_tokens: int = 0  # prompt tokens the replay found in the store
    prompt_tokens: int = 0  # every replayed prompt's tokens

    def to_dict(self) -> dict[str, Any]:
        """Plain form."""
        return {**self.setting.to_dict(), "jct_s": self.jct_s,
                "mean_trajectory_s": self.mean_trajectory_s, "ttft_mean_s": self.ttft_mean_s,
                "ttft_p90_s": self.ttft_p90_s, "snic_max_avg": self.snic_max_avg,
                "cross_conversation_hit_share": self.cross_hit_share,
                "varied": self.dimension}


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
            sim_decode = median_of([p.decode_s for p in replay().phases if p.gen > 1])
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


#: Largest relative change of the compute speed (prefill and decode, each on its own) in a
#: replicate replay: about the spread of this host's compute measurements under load.
REPLICATE_COMPUTE = 0.05
#: Largest shift of an agent's first arrival in a replicate replay, as a fraction of today's
#: mean trajectory time: the recording pins arrivals no closer than the engines' timing.
REPLICATE_ARRIVAL = 0.05


def replicate(traffic: Traffic, world: World, seed: int, scale_s: float
              ) -> tuple[Traffic, World]:
    """``traffic`` and ``world`` as replicate ``seed`` replays them (0: unchanged).

    Each agent's first arrival moves later by up to :data:`REPLICATE_ARRIVAL` x ``scale_s``
    (today's mean trajectory time) and the prefill and decode speeds by up to
    :data:`REPLICATE_COMPUTE` either way, drawn from ``seed`` alone, so replicate ``k`` of
    every setting sees the same perturbation and the run answers the same twice.
    """
    import random

    if seed == 0:
        return traffic, world
    rng = random.Random(seed)
    shift = REPLICATE_ARRIVAL * scale_s if math.isfinite(scale_s) and scale_s > 0 else 0.0
    base = traffic.starts or (0.0,) * len(traffic.plans)
    starts = tuple(t + rng.uniform(0.0, shift) for t in base)
    prefill = 1.0 + rng.uniform(-REPLICATE_COMPUTE, REPLICATE_COMPUTE)
    decode = 1.0 + rng.uniform(-REPLICATE_COMPUTE, REPLICATE_COMPUTE)
    return (replace(traffic, starts=starts),
            _scaled_world(world, prefill, decode, world.handoff_s, world.turn_gap_s))


def predict(traffic: Traffic, world: World, setting: Setting,
            dimension: str = "current", *, replicates: int = 1,
            scale_s: float = math.nan) -> Prediction:
    """Replay ``traffic`` under ``setting`` (agents at their recorded first arrivals, or
    all at t = 0), and ``replicates - 1`` replicate replays (:func:`replicate`, seeds 1,
    2, ...; ``scale_s``: today's mean trajectory time, the arrivals' shift scale).

    Raises:
        UsageError: a setting the simulator refuses (e.g. beta below one block), named.
    """
    from dualpath_cli.sim.metrics import latency_stats

    sim = _simulation(traffic, world, setting)
    sim.record = True  # TTFT samples of every turn, as an online run keeps them
    res = sim.run_offline()
    ttft = latency_stats([s[1] for s in sim.samples]) if sim.samples else None
    nan = float("nan")
    reps = []
    for seed in range(1, max(1, replicates)):
        tr, w = replicate(traffic, world, seed, scale_s)
        r = _simulation(tr, w, setting).run_offline()
        reps.append((r.jct, float(r.extra.get("mean_trajectory_s", nan))))
    return Prediction(setting, res.jct, float(res.extra.get("mean_trajectory_s", nan)),
                      ttft.mean if ttft else nan, ttft.p90 if ttft else nan,
                      res.snic_max_avg, dimension, res.cross_conversation_hit_share,
                      tuple(reps), res.hit_tokens, res.prompt_tokens)
