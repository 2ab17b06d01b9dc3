"""Simulator policies: which mechanisms are on, and which core read-path rule is used.

A simulator policy is a switch set over the paper's ablation (section 7.5) plus the core
read-path :class:`~dualpath_cli.core.policies.Policy` it calls. Engine selection is always the
core's PE fetch and two-phase DE scheduling, exactly as ``core/policies.py`` prescribes, so
comparisons isolate the loading mechanism and the read-path rule.

==============  =========  ====================  ===========================================
name            layerwise  read-path rule (core)  meaning
==============  =========  ====================  ===========================================
basic           no         basic                 PE-only reads, whole-prompt KV into HBM
layerwise       yes        basic                 + layerwise prefill
dual-rr         yes        round-robin           + dual-path loading, alternating sides
dualpath        yes        dualpath              + the scheduler's shorter-queue side
split           yes        split                 both sides, queues drain together
oracle          yes        (none)                no reads, H2D/D2H or PD transfers
==============  =========  ====================  ===========================================
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpath_cli.errors import pick

__all__ = ["SimPolicy", "SIM_POLICIES", "get_sim_policy", "ABLATION"]


@dataclass(frozen=True, slots=True)
class SimPolicy:
    """Mechanism switches for one simulated system."""

    name: str
    layerwise: bool
    read_rule: str | None   # core policy name; None = no I/O (oracle)
    description: str

    @property
    def io(self) -> bool:
        """Whether KV moves at all (False only for the oracle)."""
        return self.read_rule is not None


SIM_POLICIES: dict[str, SimPolicy] = {p.name: p for p in (
    SimPolicy("basic", False, "basic", "PE-only reads, no layerwise prefill (paper's Basic)"),
    SimPolicy("layerwise", True, "basic", "Basic + layerwise prefill"),
    SimPolicy("dual-rr", True, "round-robin", "+ dual-path loading, round-robin side"),
    SimPolicy("dualpath", True, "dualpath", "full DualPath: shorter read queue side"),
    SimPolicy("split", True, "split", "split each read so both queues drain together"),
    SimPolicy("oracle", True, None, "no storage reads, H2D/D2H or PD transfers"),
)}

ABLATION: tuple[str, ...] = ("basic", "layerwise", "dual-rr", "dualpath")
"""The paper's cumulative ablation order (Figure 12 right)."""


def get_sim_policy(name: str) -> SimPolicy:
    """The policy called ``name``, or a :class:`UsageError` naming the choices."""
    return pick(SIM_POLICIES, name, "simulator policy")
