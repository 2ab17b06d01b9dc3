"""Workload plumbing: the agents a run replays, taken from workload/ traces unchanged.

A run replays :class:`~dualpath_cli.workload.trajectory.Trajectory` turns; more agents than
the 500 base trajectories are built by workload's augmentation (a synthetic first round with
``g = 1`` in front of a sampled base trajectory, paper Appendix A.3), which shares the base
``Turn`` objects, so a 48K-agent run costs pointers, not copies.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from dualpath_cli.errors import UsageError
from dualpath_cli.workload.augment import augment
from dualpath_cli.workload.build import synthetic_trace
from dualpath_cli.workload.mooncake_link import read_agent_trace
from dualpath_cli.workload.trace_format import DEFAULT_BLOCK_TOKENS, Trace
from dualpath_cli.workload.trajectory import Trajectory, Turn

__all__ = ["AgentPlan", "MAX_AGENTS", "Workload", "check_agents", "plans_from_trajectories",
           "synthetic_plans"]


@dataclass(frozen=True, slots=True)
class AgentPlan:
    """One agent's replay: its turns in order, the shared-prefix segments its first turn
    opens with (``Trajectory.shared``; a global KV store hits them across agents), when
    its first turn arrives in an offline run (``Trajectory.start_s``; ``None``: t = 0), and
    each turn's chain of block ids (``Trajectory.blocks``, ids of ``block_tokens`` tokens;
    empty: the turn hits its context, as the paper's replay does), and whether a turn's
    generated blocks are stored when it ends (the trace header's ``outputs_stored``)."""

    turns: tuple[Turn, ...]
    shared: tuple[tuple[int, int], ...] = ()
    start_s: float | None = None
    blocks: tuple[tuple[int, ...], ...] = ()
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    outputs_stored: bool = False

    @property
    def num_turns(self) -> int:
        """Turns replayed."""
        return len(self.turns)


def plans_from_trajectories(trajectories: Sequence[Trajectory],
                            block_tokens: int = DEFAULT_BLOCK_TOKENS,
                            outputs_stored: bool = False) -> list[AgentPlan]:
    """Replay each trajectory as it is (``block_tokens``, ``outputs_stored``: the trace
    header's)."""
    plans = [AgentPlan(t.turns, t.shared, t.start_s, t.blocks, block_tokens, outputs_stored)
             for t in trajectories if t.turns]
    if not plans:
        raise UsageError("the workload has no trajectory with turns")
    return plans


MAX_AGENTS = 1_000_000
"""Most agents one run replays: 20x the paper's largest run (48K), about 1.3 GB of plans."""


def check_agents(agents: int) -> None:
    """Refuse a run size before any memory is spent on it (UsageError)."""
    if agents < 1:
        raise UsageError(f"agent count must be at least 1, got {agents}")
    if agents > MAX_AGENTS:
        raise UsageError(f"{agents:,} agents is more than one run replays ({MAX_AGENTS:,}; "
                         "an online run asks for about aps x horizon x 1.3)")


def synthetic_plans(max_len: int, agents: int, seed: int) -> list[AgentPlan]:
    """``agents`` plans from workload's Table 2-calibrated generator (augmented past 500)."""
    check_agents(agents)
    return plans_from_trajectories(synthetic_trace(max_len, agents, seed).trajectories)


@dataclass(frozen=True, slots=True)
class Workload:
    """Where a run's agents come from: the Table 2 generator at ``max_len``, or a trace.

    Why one object: ``sim run``, ``sim compare``, ``sim capacity`` and ``tune set --dry-run``
    all ask "n agents, please" (n from ``--agents`` offline, from the arrival rate online)
    and must answer it the same way for a synthetic workload and for an operator's own trace.
    """

    max_len: int
    seed: int = 1
    trace: Trace | None = None
    source: str = "synthetic"

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], seed: int = 1) -> Workload:
        """A dualpath trace file (docs/trace-format.md), read and validated now.

        A Mooncake request log is linked into trajectories first
        (:mod:`dualpath_cli.workload.mooncake_link`, as ``dualpath trace convert`` does).

        Raises:
            TraceError: unreadable or invalid file (``FILE:LINE: reason``).
            UsageError: a trace without a trajectory with turns.
        """
        trace, _ = read_agent_trace(path)
        return cls.from_trace(trace, os.fspath(path), seed)

    @classmethod
    def from_trace(cls, trace: Trace, source: str, seed: int = 1) -> Workload:
        """A trace already read (a recording's served turns, services/recording_trace.py).

        Raises:
            UsageError: a trace without a trajectory with turns.
        """
        if not any(t.turns for t in trace.trajectories):
            raise UsageError(f"{source}: the trace has no trajectory with turns")
        return cls(trace.header.max_len, seed, trace, source)

    @property
    def trace_agents(self) -> int | None:
        """Trajectories in the trace (``None`` for the synthetic workload)."""
        return None if self.trace is None else len(self.trace.trajectories)

    def plans(self, agents: int) -> list[AgentPlan]:
        """``agents`` agents: synthetic, a trace's first ones, or a trace augmented.

        A trace with fewer trajectories than asked for is augmented as the paper builds its
        1K-48K agent runs from 500 (Appendix A.3): every agent replays one of the trace's
        trajectories behind a synthetic first round, capped at the trace's max length.

        Raises:
            UsageError: ``agents < 1``, or more agents than an already augmented trace has.
        """
        check_agents(agents)
        if self.trace is None:
            return synthetic_plans(self.max_len, agents, self.seed)
        have = self.trace.trajectories
        if agents <= len(have):
            return plans_from_trajectories(have[:agents], self.trace.header.block_tokens,
                                           self.trace.header.outputs_stored)
        if any(t.prefix_seed is not None for t in have):
            raise UsageError(f"{self.source}: {agents} agents asked for but the trace has "
                             f"{len(have)}, already augmented (they cannot be augmented "
                             "again); pass at most that many or a trace of base trajectories")
        return plans_from_trajectories(augment(have, agents, self.seed, max_len=self.max_len))
