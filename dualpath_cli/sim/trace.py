"""Workload plumbing: the agents a run replays, taken from workload/ traces unchanged.

A run replays :class:`~dualpath_cli.workload.trajectory.Trajectory` turns; more agents than
the 500 base trajectories are built by workload's augmentation (a synthetic first round with
``g = 1`` in front of a sampled base trajectory, paper Appendix A.3), which shares the base
``Turn`` objects, so a 48K-agent run costs pointers, not copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dualpath_cli.errors import UsageError
from dualpath_cli.workload.build import synthetic_trace
from dualpath_cli.workload.trajectory import Trajectory, Turn

__all__ = ["AgentPlan", "plans_from_trajectories", "synthetic_plans"]


@dataclass(frozen=True, slots=True)
class AgentPlan:
    """One agent's replay: its turns in order."""

    turns: tuple[Turn, ...]

    @property
    def num_turns(self) -> int:
        """Turns replayed."""
        return len(self.turns)


def plans_from_trajectories(trajectories: Sequence[Trajectory]) -> list[AgentPlan]:
    """Replay each trajectory as it is."""
    plans = [AgentPlan(t.turns) for t in trajectories if t.turns]
    if not plans:
        raise UsageError("the workload has no trajectory with turns")
    return plans


def synthetic_plans(max_len: int, agents: int, seed: int) -> list[AgentPlan]:
    """``agents`` plans from workload's Table 2-calibrated generator (augmented past 500)."""
    if agents < 1:
        raise UsageError(f"agent count must be at least 1, got {agents}")
    return plans_from_trajectories(synthetic_trace(max_len, agents, seed).trajectories)
