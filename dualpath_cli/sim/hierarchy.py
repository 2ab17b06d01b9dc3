"""Hierarchical scheduling in the simulator, and decision timing for flat vs hierarchical.

:class:`TimedSimulation` is the flat :class:`~dualpath_cli.sim.cluster.Simulation` with
every scheduling call (a PE group's fetch, a DE drain, a DE group's fetch) timed in wall
nanoseconds (the decision latency a scheduler process would see; simulated time does not
move during a call). :class:`HierarchicalSimulation` splits the groups among ``subs``
sub-schedulers (:func:`dualpath_cli.core.hierarchy.partition`): a new turn is routed by the
root (:func:`~dualpath_cli.core.hierarchy.route_to_subs`, the DE drain's own rule one level
up, over the tokens each sub holds), then it waits in its sub's PE queue, only its sub's PE
groups fetch it, and its sub's drain routes it over the sub's DE groups only. The root's
routing is timed as a decision too. Everything else (reads, prefill, decode, HBM) is the
flat simulation's.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

from mypy_extensions import mypyc_attr

from dualpath_cli.core.de_schedule import de_route
from dualpath_cli.core.hierarchy import check_subs, partition, route_to_subs
from dualpath_cli.sim.cluster import Simulation
from dualpath_cli.sim.setup import SimSetup
from dualpath_cli.sim.state import DEngine, Group, Req
from dualpath_cli.sim.trace import AgentPlan

__all__ = ["TimedSimulation", "HierarchicalSimulation"]


@mypyc_attr(allow_interpreted_subclasses=True)
class TimedSimulation(Simulation):
    """The flat simulation, with each scheduling call's wall time in ``decision_ns``."""

    def __init__(self, setup: SimSetup, plans: Sequence[AgentPlan]) -> None:
        super().__init__(setup, plans)
        self.decision_ns: list[int] = []

    def _timed_pe_fetch(self, grp: Group) -> None:
        super()._pe_fetch(grp)

    def _pe_fetch(self, grp: Group) -> None:
        t = time.perf_counter_ns()
        self._timed_pe_fetch(grp)
        self.decision_ns.append(time.perf_counter_ns() - t)

    def _timed_de_drain(self, payload: object) -> None:
        super()._de_drain(payload)

    def _de_drain(self, payload: object) -> None:
        t = time.perf_counter_ns()
        self._timed_de_drain(payload)
        self.decision_ns.append(time.perf_counter_ns() - t)

    def _de_fetch(self, grp: Group) -> None:
        t = time.perf_counter_ns()
        super()._de_fetch(grp)
        self.decision_ns.append(time.perf_counter_ns() - t)


@mypyc_attr(allow_interpreted_subclasses=True)
class HierarchicalSimulation(TimedSimulation):
    """A root and ``subs`` sub-schedulers over the flat simulation's cluster (module doc).

    Raises:
        UsageError: ``subs`` outside 1..min(prefill nodes, decode nodes).
    """

    def __init__(self, setup: SimSetup, plans: Sequence[AgentPlan], subs: int) -> None:
        super().__init__(setup, plans)
        self.subs = check_subs(subs, len(self.pe_groups), len(self.de_groups))
        pe_parts = partition([g.idx for g in self.pe_groups], self.subs)
        de_parts = partition([g.idx for g in self.de_groups], self.subs)
        by_idx = {g.idx: g for g in (*self.pe_groups, *self.de_groups)}
        self.sub_of: dict[int, int] = {}
        for k, part in enumerate((*pe_parts, *de_parts)):
            for idx in part:
                self.sub_of[idx] = k % self.subs
        self.sub_de_groups = [[by_idx[i] for i in part] for part in de_parts]
        self.sub_pe_queue: list[deque[Req]] = [deque() for _ in range(self.subs)]
        self.sub_de_global: list[deque[Req]] = [deque() for _ in range(self.subs)]
        self.sub_idle: list[set[int]] = [set(part) for part in pe_parts]
        self.sub_tokens = [0] * self.subs  # tokens each sub holds: the root's loads
        self.sub_turns = [0] * self.subs
        self._req_sub: dict[int, int] = {}
        self.pe_idle = set()  # the flat code's wake-ups go through the subs instead

    # the root ------------------------------------------------------------------------
    def _start_turn(self, agent: int) -> None:
        super()._start_turn(agent)  # builds the Req into the (root's) pe_queue
        req = self.pe_queue.pop()
        t = time.perf_counter_ns()
        res = route_to_subs((req.core,), dict(enumerate(self.sub_tokens)))
        k = res.assignments[0][1]
        self.decision_ns.append(time.perf_counter_ns() - t)
        self.sub_tokens[k] += req.length
        self.sub_turns[k] += 1
        self._req_sub[req.rid] = k
        self.sub_pe_queue[k].append(req)
        idle = self.sub_idle[k]
        if idle:
            groups, kind = self.pe_groups, self.K_PE_FETCH
            for gidx in idle:
                grp = groups[gidx]
                grp.idle = False
                self._wake(grp, kind)
            idle.clear()

    def _finish(self, req: Req, de: DEngine) -> None:
        self.sub_tokens[self._req_sub.pop(req.rid)] -= req.length
        super()._finish(req, de)

    # a sub-scheduler -----------------------------------------------------------------
    def _timed_pe_fetch(self, grp: Group) -> None:
        grp.pending = False
        k = self.sub_of[grp.idx]
        self._fetch_from(grp, self.sub_pe_queue[k], self.sub_de_global[k], self.sub_idle[k])

    def _timed_de_drain(self, payload: object) -> None:
        self.drain_pending = False
        kind = self.K_DE_FETCH
        for k, q in enumerate(self.sub_de_global):
            if not q:
                continue
            groups = {grp.idx: grp for grp in self.sub_de_groups[k]}
            loads = {idx: grp.tok + grp.private_tokens for idx, grp in groups.items()}
            res = de_route([r.core for r in q], loads)
            for _rid, gidx in res.assignments:
                req = q.popleft()
                grp = groups[gidx]
                grp.private.append(req)
                grp.private_tokens += req.length
                req.cum_end = grp.routed = grp.routed + req.length
                if not grp.pending:
                    self._wake(grp, kind)

    def _prefill_finished(self, req: Req) -> None:
        super()._prefill_finished(req)  # the root's pe_queue is always empty: no wake there
        pe = req.pe
        assert pe is not None
        grp = pe.group
        if self.sub_pe_queue[self.sub_of[grp.idx]] and not grp.pending:
            self._wake(grp, self.K_PE_FETCH)
