"""A simulation with the client's gap between turns, a hand-off delay, and per-turn phases.

Why: the digital twin (sim/twin_replay.py) calibrates the simulator from a recording of the
cluster's own turns: it replays the recorded setting and compares what the replay did with
what the recording measured (engine busy seconds, each turn's first-to-last-token time, the
client's gap between an agent's turns), then scales the compute model until they agree.
That needs the simulated phases per turn, which the plain
:class:`~dualpath_cli.sim.cluster.Simulation` does not keep, and two per-turn latencies it
takes as zero: the time a client takes between a turn's last token and its next request
(HTTP, tokenizing, the agent's own code), and the time from a turn's first token to its
decode engine taking it beyond the modelled KV transfer (the runtime's messages and
polling between engines).

Built as a subclass over the simulation's hooks (a turn starts, a prefill finishes, a DE
joins a turn, a turn finishes), so the flat simulation's hot paths and its bit-for-bit
determinism are untouched; with both delays 0 and ``keep_phases`` False it runs as the plain
simulation does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from mypy_extensions import mypyc_attr

from dualpath_cli.sim.cluster import Simulation
from dualpath_cli.sim.metrics import SimResult
from dualpath_cli.sim.setup import SimSetup
from dualpath_cli.sim.state import DEngine, Req
from dualpath_cli.sim.trace import AgentPlan

__all__ = ["TurnPhases", "TimedSimulation"]


@dataclass(frozen=True, slots=True)
class TurnPhases:
    """One simulated turn (``agent`` is the plan's index): its time from first token to last
    (``decode_s``, what the runtime's ``tpot_s x (gen - 1)`` measures; 0 for one token)."""

    agent: int
    turn: int
    decode_s: float
    gen: int


@mypyc_attr(allow_interpreted_subclasses=True)
class TimedSimulation(Simulation):
    """:class:`Simulation` with a client gap between an agent's turns, a hand-off delay
    before a decode engine takes a turn, and per-turn phases.

    Args:
        starts: per plan, the second its first turn arrives (``None``: all at t = 0, an
            offline run); the offline JCT is then from t = 0 (the first arrival) to the
            last finish, and an agent's trajectory time counts from its own start.
        turn_gap_s: seconds from a turn's last token to the agent's next request.
        handoff_s: seconds from a turn's first token (and its modelled KV transfer) to its
            decode engine taking it.
        keep_phases: keep a :class:`TurnPhases` per finished turn in ``phases``.
    """

    def __init__(self, setup: SimSetup, plans: Sequence[AgentPlan], *,
                 starts: Sequence[float] | None = None, turn_gap_s: float = 0.0,
                 handoff_s: float = 0.0, keep_phases: bool = False) -> None:
        super().__init__(setup, plans)
        if starts is not None and (len(starts) != len(self.plans)
                                   or not all(x >= 0 for x in starts)):
            raise ValueError("starts: one time >= 0 s per plan")
        self.starts = list(starts) if starts is not None else None
        for name, value in (("turn gap", turn_gap_s), ("hand-off", handoff_s)):
            if not value >= 0:
                raise ValueError(f"{name} {value!r}: must be >= 0 s")
        self.turn_gap_s = turn_gap_s
        self.handoff_s = handoff_s
        self.keep_phases = keep_phases
        self.phases: list[TurnPhases] = []
        self._handed: set[int] = set()  # rids whose hand-off delay has passed
        self.K_NEXT_TURN = self.loop.register(self._next_turn)
        self.K_HANDOFF = self.loop.register(self._handed_over)

    # an agent's first turn at its start, its next ones after the client's gap
    def _next_turn(self, agent: int) -> None:
        if self.next_turn[agent] == 0:
            self.agent_start[agent] = self.loop.now
        super()._start_turn(agent)  # the arrival itself: this class's delay is passed

    def _start_turn(self, agent: int) -> None:
        if self.next_turn[agent] > 0:
            if self.turn_gap_s > 0:
                self.loop.at(self.loop.now + self.turn_gap_s, self.K_NEXT_TURN, agent)
                return
        elif self.starts is not None and self.starts[agent] > self.loop.now:
            self.loop.at(self.starts[agent], self.K_NEXT_TURN, agent)
            return
        super()._start_turn(agent)

    def run_offline(self) -> SimResult:
        """As :meth:`Simulation.run_offline`; the mean trajectory time counts each agent
        from its own start."""
        res = super().run_offline()
        if self.starts is not None:
            res.extra["mean_trajectory_s"] = float(np.mean(
                [e - s for e, s in zip(self.agent_end, self.agent_start, strict=True)]))
        return res

    # the decode engine takes the turn after the hand-off delay
    def _handed_over(self, req: Req) -> None:
        self._handed.add(req.rid)
        self._de_join(req)

    def _de_join(self, req: Req) -> None:
        if self.handoff_s > 0 and req.rid not in self._handed:
            self.loop.at(self.loop.now + self.handoff_s, self.K_HANDOFF, req)
            return
        self._handed.discard(req.rid)
        super()._de_join(req)

    def _finish(self, req: Req, de: DEngine) -> None:
        if self.keep_phases:
            self.phases.append(TurnPhases(req.agent, req.turn, self.loop.now - req.t_first,
                                          req.gen))
        super()._finish(req, de)
