"""Built-in agentic workloads sized for the embedded reference model.

The paper's Table 2 traces (32K-64K tokens per agent) are far too long for a CPU model in a
one-minute run, so ``dualpath bench`` replays short trajectories with the same shape: a long
first round, then rounds whose appends are small next to the growing context (so almost
every token of a later round is a cache hit and reading dominates).
"""

from __future__ import annotations

from dualpath_cli.workload.trajectory import Trajectory, Turn

__all__ = ["agentic_workload"]


def agentic_workload(agents: int, turns: int = 4, first_append: int = 256, append: int = 32,
                     gen: int = 4, seed: int = 0) -> list[Trajectory]:
    """``agents`` trajectories of ``turns`` rounds; agent ``k`` has its own token seeds."""
    rounds = (Turn(first_append, gen),) + tuple(Turn(append, gen) for _ in range(turns - 1))
    return [Trajectory(k, rounds, token_seed=seed * 100003 + k, prefix_seed=None)
            for k in range(agents)]
