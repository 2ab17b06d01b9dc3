"""Simulator policies: the rows of core's one policy table, read as mechanism switches.

The simulator runs whatever :data:`dualpath_cli.core.policies.POLICIES` holds (built-in rows
and those plugins registered): a row's ``layerwise`` switches layerwise prefill, its
``shaped`` switch off (the oracle) means no storage reads, H2D/D2H or PD transfers are
modelled, and its ``plan`` is the read rule. Engine selection is always core's PE fetch and
two-phase DE scheduling, so comparisons isolate the loading mechanism and the read rule.
"""

from __future__ import annotations

from dualpath_cli.core.policies import POLICIES, Policy, get_policy

__all__ = ["SimPolicy", "SIM_POLICIES", "get_sim_policy", "ABLATION"]

SimPolicy = Policy
"""A simulator policy is a core policy row (the old name, kept for callers)."""

SIM_POLICIES = POLICIES
"""The one policy table (not a copy: a plugin's policy registered there runs here too)."""

ABLATION: tuple[str, ...] = ("basic", "layerwise", "round-robin", "dualpath")
"""The paper's cumulative ablation order (Figure 12 right)."""


def get_sim_policy(name: str) -> Policy:
    """The policy called ``name``, or a :class:`UsageError` naming the choices."""
    return get_policy(name)
