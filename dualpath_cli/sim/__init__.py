"""Discrete-event cluster simulator: the core/ scheduler in simulated time.

Public API (everything else is private to the package)::

    make_setup(model, pd, policy, hardware, calibration, seed) -> SimSetup
    simulate_offline(setup, plans=None, agents=..., max_len=...) -> SimResult
    simulate_online(setup, aps, horizon=..., ...) -> SimResult
    simulate_capacity(setup, lo=..., hi=..., ...) -> CapacityResult
    Workload(max_len, seed) / Workload.from_file(path, seed) -> .plans(agents)

Each ``simulate_*`` takes ``progress=``, a callback told how far the run is
(:class:`RunProgress`, sim/progress.py).

The timing model it runs (:mod:`dualpath_cli.core.costs`) and its calibration
(:mod:`dualpath_cli.core.calibration`: ``SimCalibration``, ``calibrate_from_measurements``)
are pure and live in core/, so the emulated runtime times its engines with the same model.
"""

from dualpath_cli.sim.api import (
    make_setup,
    online_agents,
    relabelled,
    simulate_capacity,
    simulate_offline,
    simulate_online,
)
from dualpath_cli.sim.cluster import Simulation
from dualpath_cli.sim.metrics import LatencyStats, SimResult
from dualpath_cli.sim.online import SLO, CapacityResult, find_capacity, meets_slo
from dualpath_cli.sim.policies import ABLATION, SIM_POLICIES, SimPolicy, get_sim_policy
from dualpath_cli.sim.progress import ProgressFn, RunProgress
from dualpath_cli.sim.setup import SimSetup
from dualpath_cli.sim.trace import AgentPlan, Workload, plans_from_trajectories, synthetic_plans

__all__ = [
    "make_setup", "simulate_offline", "simulate_online", "simulate_capacity", "online_agents",
    "Workload",
    "SimSetup", "Simulation",
    "LatencyStats", "SimResult", "SLO", "CapacityResult", "find_capacity", "meets_slo",
    "ABLATION", "SIM_POLICIES", "SimPolicy", "get_sim_policy", "AgentPlan",
    "plans_from_trajectories", "synthetic_plans", "RunProgress", "ProgressFn", "relabelled",
]
