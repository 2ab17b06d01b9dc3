"""Built-in agentic workloads sized for the embedded reference model.

The paper's Table 2 traces (32K-64K tokens per agent) are far too long for a CPU model in a
one-minute run, so ``dualpath bench`` replays short trajectories with the same shape: many
rounds whose appends are small next to the growing context (so most tokens of a later round
are cache hits and reading dominates), and a short first round (it is pure prefill for every
policy, so a long one would only dilute the comparison).
"""

from __future__ import annotations

from dualpath_cli.workload.trajectory import Trajectory, Turn

__all__ = ["agentic_workload"]


def agentic_workload(agents: int, turns: int = 12, first_append: int = 128, append: int = 64,
                     gen: int = 2, seed: int = 0) -> list[Trajectory]:
    """``agents`` trajectories of ``turns`` rounds; agent ``k`` has its own token seeds."""
    rounds = (Turn(first_append, gen),) + tuple(Turn(append, gen) for _ in range(turns - 1))
    return [Trajectory(k, rounds, token_seed=seed * 100003 + k, prefix_seed=None)
            for k in range(agents)]
