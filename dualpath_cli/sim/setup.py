"""What defines a simulated cluster (:class:`SimSetup`), and the checks and thresholds that
follow from it and the workload before a run starts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dualpath_cli.core.calibration import SimCalibration
from dualpath_cli.core.costs import CostModel
from dualpath_cli.core.policies import Policy
from dualpath_cli.core.profiles import HardwareProfile, ModelProfile
from dualpath_cli.core.thresholds import tokens_processable, tokens_readable
from dualpath_cli.errors import ConfigError, UsageError
from dualpath_cli.sim.trace import AgentPlan

__all__ = ["SimSetup", "check_fits_decode_hbm", "derive_thresholds"]


@dataclass(frozen=True)
class SimSetup:
    """Everything that defines a simulated cluster, apart from the workload.

    ``alpha``/``beta`` of None are derived as the paper does (3 s of reads, 5 s of work).
    ``seed`` seeds the ``random`` read rule and the online arrivals (config
    ``scheduler.random_seed``); ``layerwise_prefill`` False turns layerwise prefill off
    whatever the policy; ``controllers`` names the dynamic controllers that run
    (:mod:`dualpath_cli.core.controllers`: ``alpha``, ``beta``, ``quota``), one step every
    ``control_interval_s`` simulated seconds. ``nodes_per_group`` (config
    ``cluster.nodes_per_group``) forms the engine groups as :mod:`dualpath_cli.core.groups`
    says: consecutive nodes of one role, the last group smaller when the count is not a
    multiple.
    """

    model: ModelProfile
    hardware: HardwareProfile
    prefill_nodes: int
    decode_nodes: int
    policy: Policy
    calibration: SimCalibration = field(default_factory=SimCalibration)
    seed: int = 0
    alpha: int | None = None
    beta: int | None = None
    bin_s: float = 5.0
    layerwise_prefill: bool = True
    controllers: tuple[str, ...] = ()
    control_interval_s: float = 2.0
    sub_schedulers: int = 0  # > 0: hierarchical scheduling (sim/hierarchy.py)
    nodes_per_group: int = 1  # engine groups span this many nodes (core/groups.py)

    @property
    def pd(self) -> str:
        """The deployment as ``2P4D``."""
        return f"{self.prefill_nodes}P{self.decode_nodes}D"


def derive_thresholds(cost: CostModel, plans: Sequence[AgentPlan]) -> tuple[int, int]:
    """The paper's alpha (tokens the SNIC reads in 3 s) and beta (tokens a PE processes in 5 s).

    core's PE fetch charges a request's full length to ``tok``, so beta is counted in the
    same unit: core's ``HardwareProfile.prompt_tokens_per_s`` (the formula config and
    ``tune beta`` use) at the workload's mean context and append (the paper's "profiling").
    The cost model's FLOP/s is the hardware profile's peak x MFU, so both agree.
    """
    cal = cost.calibration
    alpha = tokens_readable(cost.snic_rate, cost.kv_bytes_per_token, cal.alpha_window_s)
    ctx_sum = app_sum = n = 0
    for p in plans[:500]:
        ctx = 0
        for t in p.turns:
            ctx_sum += ctx
            app_sum += t.append
            ctx += t.append + t.gen
            n += 1
    if n == 0:
        raise UsageError("the workload has no turns")
    c, a = ctx_sum // n, max(1, app_sum // n)
    rate = cost.hardware.prompt_tokens_per_s(cost.model, c, a)
    return alpha, tokens_processable(rate, cal.beta_window_s)


def check_fits_decode_hbm(plans: Sequence[AgentPlan], de_hbm_tokens: int,
                          setup: SimSetup) -> None:
    """Fail before the run when an agent's whole context cannot sit in one DE's HBM.

    Why up front: a decode engine holds a turn's prompt and generated tokens, so the agent
    whose context grows largest would otherwise stop the run when it gets there, which in an
    online probe can be deep into a long simulation.
    """
    longest, agent = 0, -1
    for i, plan in enumerate(plans):
        total = 0
        for t in plan.turns:
            total += (t.append if t.append > 1 else 1) + (t.gen if t.gen > 1 else 1)
        if total > longest:
            longest, agent = total, i
    if longest > de_hbm_tokens:
        raise ConfigError(
            f"agent {agent} reaches {longest} tokens of context, more than one decode "
            f"engine's HBM holds for {setup.model.name} on {setup.hardware.name} "
            f"({de_hbm_tokens} tokens after weights): use a shorter --max-len, more decode "
            "nodes (expert-parallel models) or a hardware profile with more HBM")
