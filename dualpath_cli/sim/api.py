"""The simulator's front door: build a setup from names, run offline, online or capacity.

Front-ends (``dualpath sim``, ``tune set --dry-run``, bench scripts) call these and nothing
deeper, so every run is configured the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dualpath_cli.config.model import Config, parse_pd
from dualpath_cli.config.schema import check_built
from dualpath_cli.core.calibration import SimCalibration
from dualpath_cli.core.controllers import CONFIG_KEYS
from dualpath_cli.core.groups import node_groups
from dualpath_cli.core.hierarchy import check_subs, default_subs
from dualpath_cli.core.policies import Policy
from dualpath_cli.core.profiles import get_hardware_profile, get_model_profile
from dualpath_cli.errors import ConfigError
from dualpath_cli.sim.cluster import Simulation
from dualpath_cli.sim.metrics import SimResult
from dualpath_cli.sim.online import (
    SLO,
    CapacityResult,
    StopRule,
    check_aps_range,
    check_online,
    find_capacity,
    meets_slo,
)
from dualpath_cli.sim.policies import get_sim_policy
from dualpath_cli.sim.progress import ProgressFn, RunProgress
from dualpath_cli.sim.setup import SimSetup
from dualpath_cli.sim.trace import AgentPlan, synthetic_plans

__all__ = ["make_setup", "simulate_offline", "simulate_online", "simulate_capacity",
           "online_agents", "SimKnobs", "knobs_from_config", "relabelled"]


@dataclass(frozen=True, slots=True)
class SimKnobs:
    """The scheduler keys of a config the simulator honours (flags override each).

    ``policy`` is ``scheduler.read_side``; ``controllers`` the dynamic controllers that are
    on (``alpha``, ``beta``, ``quota``); ``seed`` is ``scheduler.random_seed``;
    ``nodes_per_group`` is ``cluster.nodes_per_group``.
    """

    policy: str = "dualpath"
    layerwise_prefill: bool = True
    controllers: tuple[str, ...] = ()
    seed: int = 0
    hierarchical: bool = False
    nodes_per_group: int = 1
    sub_schedulers: int = 0


def knobs_from_config(config: Config) -> SimKnobs:
    """:class:`SimKnobs` from a loaded config.

    Raises:
        ConfigError: a key switched on that the simulator does not build (none today;
            ``scheduler.hierarchical`` runs :mod:`~dualpath_cli.sim.hierarchy`).
    """
    check_built(config, world="sim")
    s = config.scheduler
    if s.sub_schedulers and not s.hierarchical:
        raise ConfigError(f"scheduler.sub_schedulers {s.sub_schedulers}: set only with "
                          "hierarchical scheduling (scheduler.hierarchical=true)")
    on = tuple(name for name, key in CONFIG_KEYS.items() if getattr(s, key))
    return SimKnobs(s.read_side, s.layerwise_prefill, on, s.random_seed, s.hierarchical,
                    config.cluster.nodes_per_group, s.sub_schedulers)


def make_setup(model: str = "ds660b", pd: str = "2P4D", policy: str | Policy = "dualpath",
               hardware: str = "hopper", calibration: SimCalibration | None = None,
               seed: int = 0, alpha: int | None = None, beta: int | None = None, *,
               layerwise_prefill: bool = True, controllers: tuple[str, ...] = (),
               control_interval_s: float = 2.0, hierarchical: bool = False,
               nodes_per_group: int = 1, sub_schedulers: int = 0) -> SimSetup:
    """A :class:`SimSetup` from profile and policy names (errors name the bad value).

    ``hierarchical`` uses ``sub_schedulers`` sub-schedulers (0:
    :func:`~dualpath_cli.core.hierarchy.default_subs`)
    (over the groups ``nodes_per_group`` forms, :mod:`dualpath_cli.core.groups`).
    """
    spec = parse_pd(pd)
    pe_groups = len(node_groups(spec.prefill_nodes, nodes_per_group))
    de_groups = len(node_groups(spec.decode_nodes, nodes_per_group))
    return SimSetup(model=get_model_profile(model),
                    hardware=get_hardware_profile(hardware),
                    prefill_nodes=spec.prefill_nodes, decode_nodes=spec.decode_nodes,
                    policy=policy if isinstance(policy, Policy) else get_sim_policy(policy),
                    calibration=calibration or SimCalibration(), seed=seed,
                    alpha=alpha, beta=beta, layerwise_prefill=layerwise_prefill,
                    controllers=tuple(controllers), control_interval_s=control_interval_s,
                    sub_schedulers=(check_subs(sub_schedulers or default_subs(
                        pe_groups, de_groups), pe_groups, de_groups) if hierarchical else 0),
                    nodes_per_group=nodes_per_group)


def simulate_offline(setup: SimSetup, plans: list[AgentPlan] | None = None, *,
                     agents: int = 2048, max_len: int = 64_000,
                     trace_seed: int = 1, progress: ProgressFn | None = None) -> SimResult:
    """Offline JCT: ``agents`` agents (or ``plans``) start at t = 0 (or at their plans'
    ``start_s``). ``progress`` is told how far the run is (sim/progress.py)."""
    plans = plans if plans is not None else synthetic_plans(max_len, agents, trace_seed)
    sim = simulation(setup, plans)
    sim.progress = progress
    return sim.run_offline()


def simulate_online(setup: SimSetup, aps: float, *, horizon: float = 1800.0,
                    warmup: float | None = None, max_len: int = 64_000,
                    trace_seed: int = 1, plans: list[AgentPlan] | None = None,
                    slo: SLO | None = None, early_stop: bool = True,
                    progress: ProgressFn | None = None) -> SimResult:
    """One online run at ``aps`` agents/s for at most ``horizon`` s.

    Latencies count turns arriving after ``warmup`` (default: a third of the horizon).
    With ``early_stop`` the run ends as the paper's do (:class:`StopRule`: TTFT over the
    last 150 s above the SLO's bound, or steady state); ``slo_ok`` says whether it met
    ``slo``.
    """
    check_online(aps, horizon)
    slo = slo or SLO()
    if plans is None:
        plans = synthetic_plans(max_len, online_agents(aps, horizon), trace_seed)
    sim = simulation(setup, plans)
    sim.progress = progress
    res = sim.run_online(
        aps, horizon, warmup=horizon / 3 if warmup is None else warmup,
        stop_rule=StopRule(ttft_bound=slo.ttft_s) if early_stop else None)
    res.slo_ok = meets_slo(res, slo)
    return res


def simulation(setup: SimSetup, plans: list[AgentPlan]) -> Simulation:
    """The flat simulation, or the hierarchical one when ``setup.sub_schedulers`` > 0."""
    if setup.sub_schedulers > 0:
        from dualpath_cli.sim.hierarchy import HierarchicalSimulation

        return HierarchicalSimulation(setup, plans, setup.sub_schedulers)
    return Simulation(setup, plans)


def online_agents(aps: float, horizon: float) -> int:
    """Agents an online run of ``aps`` agents/s for ``horizon`` s may need (Poisson slack).

    Raises:
        UsageError: a rate or horizon that is not a finite number > 0.
    """
    check_online(aps, horizon)
    return int(aps * horizon * 1.3) + 50


def simulate_capacity(setup: SimSetup, *, lo: float = 0.05, hi: float = 2.0,
                      horizon: float = 1200.0, max_len: int = 64_000, trace_seed: int = 1,
                      steps: int = 6, slo: SLO | None = None,
                      plans: list[AgentPlan] | None = None,
                      progress: ProgressFn | None = None) -> CapacityResult:
    """Highest APS meeting ``slo`` in ``[lo, hi]`` (bisection over online runs).

    ``plans`` must hold :func:`online_agents` ``(hi, horizon)`` agents when given.
    ``progress`` hears each probe as run ``i`` of at most ``steps + 2`` (labelled with
    its rate; a search that ends early skips the rest).
    """
    check_aps_range(lo, hi)
    if plans is None:
        plans = synthetic_plans(max_len, online_agents(hi, horizon), trace_seed)

    slo = slo or SLO()

    probes = 0

    def run_at(aps: float) -> SimResult:
        nonlocal probes
        report = None
        if progress is not None:
            report = relabelled(progress, probes, steps + 2, f"probe {probes + 1}: "
                                 f"{aps:.3g} APS")
        probes += 1
        return simulate_online(replace(setup), aps, horizon=horizon, plans=plans, slo=slo,
                               progress=report)

    return find_capacity(run_at, lo, hi, slo, steps)


def relabelled(progress: ProgressFn, run: int, runs: int, label: str) -> ProgressFn:
    """``progress`` for run ``run`` of ``runs`` (a probe, a compared policy), labelled."""

    def report(p: RunProgress) -> None:
        progress(replace(p, run=run, runs=runs, label=label))

    return report
