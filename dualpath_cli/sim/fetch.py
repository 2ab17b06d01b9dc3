"""The schedulers' fetches: PE groups take turns from the global PE queue (core
``pe_fetch``), the DE drain routes them to DE groups (``de_route``), and a DE group places
them on its engines under its HBM (``de_place``); then the turn's reads start.

Each group fetches at its own periodic tick (pull-based, paper 6.1), phased apart from the
others; an idle group is woken, not polled. For speed the fetches use core's in-place forms
on the groups' own snapshots (``pe_fetch_in_place``; ``de_place`` as ``z_threshold`` plus
``place_under_z``, with ``|R|`` and its total taken from running sums), which compute
exactly what the copying forms compute.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from itertools import islice
from operator import attrgetter

from mypy_extensions import mypyc_attr

from dualpath_cli.core.de_schedule import de_route, place_under_z, z_threshold
from dualpath_cli.core.pe_fetch import pe_fetch_in_place
from dualpath_cli.sim.base import SimBase
from dualpath_cli.sim.state import Group, Req

__all__ = ["FetchStage"]

_DE_HEAD_MAX = 4096   # bound on the private-queue head offered to one DE fetch
_cum_end = attrgetter("cum_end")
_core = attrgetter("core")  # lazily, as a generator would: a fetch may stop early


@mypyc_attr(allow_interpreted_subclasses=True)
class FetchStage(SimBase):
    """The fetch handlers of :class:`~dualpath_cli.sim.cluster.Simulation`."""

    def _tick(self, grp: Group) -> float:
        """The next periodic fetch time of ``grp`` at or after now."""
        period = self._period
        ph = grp.tick_ph
        return ph + period * math.ceil((self.loop.now - ph) / period - 1e-12)

    def _wake(self, grp: Group, kind: int) -> None:
        if not grp.pending:
            grp.pending = True
            period = self._period
            ph = grp.tick_ph
            self._at(ph + period * math.ceil((self.loop.now - ph) / period - 1e-12), kind, grp)

    # ----------------------------------------------------------------- PE fetch
    def _pe_fetch(self, grp: Group) -> None:
        grp.pending = False
        self._fetch_from(grp, self.pe_queue, self.de_global, self.pe_idle)

    def _fetch_from(self, grp: Group, q: deque[Req], de_global: deque[Req],
                    idle: set[int]) -> None:
        """One PE group fetch from queue ``q`` into ``de_global``; the hierarchical
        scheduler calls it per sub-scheduler with that sub's queues and idle set."""
        if not q:
            grp.idle = True
            idle.add(grp.idx)
            return
        snaps = grp.snaps
        for node, node_snaps in grp.nodes:  # each engine reports its own node's queue
            read_q = node.read_q
            for sn in node_snaps:
                sn.read_q = read_q
        assignments, stop = pe_fetch_in_place(map(_core, q), snaps, self.alpha, self.beta)
        if assignments:
            engines = self.engines
            for _rid, eid in assignments:
                req = q.popleft()
                req.pe = engines[eid]  # type: ignore[assignment]
                de_global.append(req)
            if not self.drain_pending:
                self.drain_pending = True
                self._at(self._tick(self.de_groups[0]), self.K_DE_DRAIN, None)
        if stop == "queue_empty":
            if q:
                self._wake(grp, self.K_PE_FETCH)
            else:
                grp.idle = True
                idle.add(grp.idx)

    # ----------------------------------------------------------------- DE phase 1 and 2
    def _de_drain(self, _: object) -> None:
        self.drain_pending = False
        q = self.de_global
        if not q:
            return
        loads = {grp.idx: grp.tok + grp.private_tokens for grp in self.de_groups}
        res = de_route([r.core for r in q], loads)
        groups, first, kind = self.de_groups, len(self.pe_groups), self.K_DE_FETCH
        for _rid, gidx in res.assignments:
            req = q.popleft()
            grp = groups[gidx - first]  # DE groups are numbered in order, after the PE groups
            grp.private.append(req)
            grp.private_tokens += req.length
            req.cum_end = grp.routed = grp.routed + req.length
            if not grp.pending:
                self._wake(grp, kind)

    def _de_fetch(self, grp: Group) -> None:
        grp.pending = False
        priv = grp.private
        if not priv:
            return
        snaps = grp.snaps
        first = priv[0].length
        for sn in snaps:
            if sn.healthy and sn.hbm_free >= first:
                break
        else:  # no DE has room for the head: core's placement would stop at once, empty
            return
        # core's de_place on the head R + 1 of the queue (R: the longest head whose total
        # fits the group's free HBM, at most _DE_HEAD_MAX requests offered), without walking
        # it: |R| by bisection over the running totals, sum(R) by one subtraction, then Z by
        # core's z_threshold and the placement loop by core's place_under_z, as de_place does
        free = grp.hbm_free
        base = priv[0].cum_end - first
        fit = bisect_right(priv, base + free, key=_cum_end)
        offered = min(fit + 1, len(priv), _DE_HEAD_MAX)
        r_count = fit if fit < offered else offered
        r_tokens = priv[r_count - 1].cum_end - base if r_count else 0
        live = [sn for sn in snaps if sn.healthy]
        z = z_threshold(r_tokens, live, self._z_factor)
        assignments, stop = place_under_z(map(_core, islice(priv, offered)), live, z)
        engines = self.engines
        for _rid, eid in assignments:
            req = priv.popleft()
            de = engines[eid]
            req.de = de  # type: ignore[assignment]
            length, gen = req.length, req.gen
            de.snap.hbm_free -= gen  # generated tokens also live in HBM
            grp.private_tokens -= length
            grp.tok += length
            grp.hbm_free -= length + gen
            self._start_io(req)
        if stop == "queue_empty" and priv:
            self._wake(grp, self.K_DE_FETCH)
