"""The scheduler's decisions: DE group fetch (route, place), PE group fetch (PE, read side,
charges), the dispatch to the chosen pair, and the decision's record.

Each decision calls core/ functions only (:func:`~dualpath_cli.core.de_schedule.de_route_in_place`,
:func:`~dualpath_cli.core.de_schedule.de_place`, :func:`~dualpath_cli.core.pe_fetch.pick_pe`,
:func:`~dualpath_cli.core.policies.read_plan`) on snapshots of the fetching group's engines,
and logs its inputs as they were before it. The inputs are kept cheap (a routing pass shared
by its turns, packed snapshot rows) and made into dicts only when a decision is read.
"""

from __future__ import annotations

import array
import functools
import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

from dualpath_cli.core.de_schedule import GroupLoads, de_place, de_route_in_place, placement_classes
from dualpath_cli.core.pe_fetch import classify_pe, pick_pe
from dualpath_cli.core.policies import charge_read, read_plan
from dualpath_cli.core.types import EngineSnapshot, Role
from dualpath_cli.errors import NoAvailableEngine
from dualpath_cli.runtime.engine_table import EngineState
from dualpath_cli.runtime.ledger import Lookup
from dualpath_cli.runtime.sched_control import ThresholdControl
from dualpath_cli.runtime.turns import Flight, Routed, RoutePass
from dualpath_cli.runtime.wire import Cancel, Prefill, TokenArray

__all__ = ["Dispatching"]

_HEAD = 8  # queue-head request ids kept in a decision's inputs

_ROLES: dict[str, Role] = {r.value: r for r in Role}
_ROLE_NAMES: dict[Role, str] = {r: r.value for r in Role}


#: an engine snapshot's values at a PE decision, kept until the decision is read
_SnapRow = tuple[int, Role, int, int, int, int, int, int]
#: fields of a packed engine snapshot (:func:`_pack_rows`)
_ROW_FIELDS = 8
_ROLE_ORDER: tuple[Role, ...] = tuple(Role)


def _snap_row(e: EngineSnapshot) -> _SnapRow:
    return (e.engine_id, e.role, e.node, e.group, e.seq, e.tok, e.read_q, e.hbm_free)


def _row_dict(r: _SnapRow) -> dict[str, Any]:
    """A snapshot as a decision's inputs show it."""
    return {"id": r[0], "role": _ROLE_NAMES[r[1]], "node": r[2], "group": r[3], "seq": r[4],
            "tok": r[5], "read_q": r[6], "hbm_free": r[7]}


def _pack_rows(snaps: Iterable[EngineSnapshot]) -> array.array[int]:
    """Snapshots as one flat int64 array, ``_ROW_FIELDS`` a snapshot (the role as its
    index). Why: a DE placement's snapshots are kept (a dict each, before) until the ring
    drops the last decision of the turns it placed, ~10,000 decisions later, and each
    object was then freed from a cold cache line. (A PE decision's tuples are cheaper to
    make than to pack: kept as they are.)"""
    index = _ROLE_ORDER.index
    return array.array("q", [v for e in snaps for v in (
        e.engine_id, index(e.role), e.node, e.group, e.seq, e.tok, e.read_q, e.hbm_free)])


def _row_dicts(flat: array.array[int]) -> list[dict[str, Any]]:
    """:func:`_pack_rows`' snapshots as a decision's inputs show them."""
    rows = flat.tolist()
    return [_row_dict((rows[i], _ROLE_ORDER[rows[i + 1]], rows[i + 2], rows[i + 3],
                       rows[i + 4], rows[i + 5], rows[i + 6], rows[i + 7]))
            for i in range(0, len(rows), _ROW_FIELDS)]


def _pe_fetch_inputs(head: list[int], pes: list[_SnapRow], de: _SnapRow,
                     flight: dict[str, Any], look: Lookup | None) -> dict[str, Any]:
    """A PE fetch decision's inputs, built when the decision is first read (``flight``:
    its route, placement, ordinal, thresholds and their sources, as they were)."""
    route, place = flight["de_route"], flight["de_place"]
    if "engines" in place:  # the DE group's snapshots, packed when it was placed
        place = {**place, "engines": _row_dicts(place["engines"]),
                 "queue_head": place["queue_head"].tolist()}
    return {"pe_queue_head": head, "pe_engines": [_row_dict(r) for r in pes],
            "de_engine": _row_dict(de), **flight, "de_place": place,
            "sources": dict(flight["sources"]),
            "de_route": route.as_dict() if route is not None else {},
            "lookup": look.as_dict(chain=True) if look is not None else {}}


class Dispatching(ThresholdControl):
    """Group fetches, dispatches, re-queues and decision records (module doc)."""

    def _members(self) -> tuple[dict[str, dict[int, list[EngineState]]],
                                dict[int, list[EngineState]]]:
        """Engines by role and group, and by node, in registration order (rebuilt when an
        engine is set in :attr:`engines`): a fetch reads its own group, not all 1,152."""
        version = self.engines.version
        if self._index_n != version:
            by_group: dict[str, dict[int, list[EngineState]]] = {
                Role.PREFILL.value: {}, Role.DECODE.value: {}}
            by_node: dict[int, list[EngineState]] = {}
            for e in self.engines.values():
                by_group.setdefault(e.role, {}).setdefault(e.group, []).append(e)
                by_node.setdefault(e.node, []).append(e)
            self._by_group, self._by_node = by_group, by_node
            self._index_n = version
        return self._by_group, self._by_node

    def _live_members(self, role: str) -> dict[int, list[EngineState]]:
        """``role``'s groups that have live engines which said hello, with those engines in
        registration order (cached until an engine registers, says hello, dies or returns).

        A group's ``tok`` is :attr:`_de_group_tok`: an engine that is dead or never said
        hello holds no turn (its turns are re-queued when it dies), so its live engines'
        tokens are all of the group's.
        """
        key = (self._live_version, self.engines.version)
        if key != self._live_key:
            live: dict[str, dict[int, list[EngineState]]] = {}
            for r, groups in self._members()[0].items():
                live[r] = {}
                for g, members in groups.items():
                    alive = [e for e in members if e.alive and e.address
                             and not e.drain_until]  # draining: no new turns
                    if alive:
                        live[r][g] = alive
            self._live, self._live_key = live, key
        return self._live.get(role, {})

    def _node_q(self, node: int) -> int:
        """The node's read queue: its live engines' reported queues plus pending charges."""
        return sum(e.read_q for e in self._members()[1].get(node, ()) if e.alive)

    def _snapshot(self, e: EngineState, node_q: dict[int, int]) -> EngineSnapshot:
        """``e`` as the core's functions see it (``node_q`` memoises the node's queue)."""
        q = node_q.get(e.node)
        if q is None:
            q = node_q[e.node] = self._node_q(e.node)
        eid = e.engine_id
        return EngineSnapshot(eid, e.node, e.group, _ROLES[e.role], self._seq.get(eid, 0),
                              self._tok.get(eid, 0), q,
                              self.hbm_tokens - self._hbm_used.get(eid, 0))

    def _group_snapshots(self, role: str, group: int, node_q: dict[int, int],
                         ) -> list[EngineSnapshot]:
        """Snapshots of the group's live engines that said hello, in registration order."""
        return [self._snapshot(e, node_q) for e in self._live_members(role).get(group, ())]

    def _de_fetch(self, group: int) -> None:
        """A DE group fetch: phase 1 over the global FIFO, phase 2 on this group's queue."""
        if not self.queue and not self.private.get(group):
            return
        de = Role.DECODE.value
        node_q: dict[int, int] = {}
        engines = self._group_snapshots(de, group, node_q)
        if not engines:
            return
        if self.queue:
            # every live DE group's load: its engines' tokens plus what is routed to it
            live = self._live_members(de)
            group_loads = self._group_loads
            if group_loads is None or self._group_loads_for is not live:
                # live groups changed (a new cached dict) or the loads were dropped (a
                # recount, a group gone): rebuilt, and every live group has a queue (the
                # view lists them)
                routed_tok, group_tok = self._routed_tok, self._de_group_tok
                group_loads = self._group_loads = GroupLoads(
                    {g: group_tok.get(g, 0) + routed_tok.get(g, 0) for g in live})
                self._group_loads_for = live
                for g in live:
                    self.private[g]  # a defaultdict: touching a group makes its queue
            head = [f.rid for f in itertools.islice(self.queue, _HEAD)]
            flights = list(self.queue)
            # each request's inputs: the loads just before its routing
            routing = RoutePass(head, group_loads.as_dict())
            # on the kept loads: routing adds each turn's tokens to its group, as
            # _group_load_add would
            assignments = de_route_in_place([self._request(f) for f in flights], group_loads)
            self.queue.clear()
            for i, (f, (_, g)) in enumerate(zip(flights, assignments, strict=True)):
                f.route = Routed(routing, i)
                routing.steps.append((g, len(f.req.tokens)))
                self.private[g].append(f)
                self._routed_tok[g] += len(f.req.tokens)
        private = self.private[group]
        if not private:
            return
        before = _pack_rows(engines)
        place_head = array.array("q", [f.rid for f in itertools.islice(private, _HEAD)])
        queue = [self._request(f) for f in private]
        res = de_place(queue, engines, self.params.z_factor)
        classes = placement_classes(queue, [e for e in engines if e.healthy],
                                    res.assignments, res.z)
        for (_, de_id), cls in zip(res.assignments, classes, strict=True):
            f = private.popleft()
            self._routed_tok[group] -= len(f.req.tokens)
            self._group_load_add(group, -len(f.req.tokens))
            if f.pe >= 0 or f.de >= 0:  # (a routed turn has neither yet)
                self._load_delta(f, -1)
            f.de, f.de_group = de_id, group
            self._load_delta(f, 1)
            f.place = {"queue_head": place_head, "engines": before, "z": res.z,
                       "r_count": res.r_count, "stop": res.stop_reason, "de": de_id,
                       "de_class": cls.value}
            self.pe_queue.append(f)

    def _pe_fetch(self, group: int) -> None:
        """A PE group fetch: the PE by Algorithm 1, then the read side, charged at once."""
        if not self.pe_queue:
            return
        node_q: dict[int, int] = {}
        pes = self._group_snapshots(Role.PREFILL.value, group, node_q)
        if not pes:
            return
        # the DEs the queued turns were placed on, each as it stands when first needed: a
        # dispatch in this fetch changes only the read queues of the nodes it charges, which
        # charge_read below also adds to every snapshot already taken
        des: list[EngineSnapshot] = []
        de_by_id: dict[int, EngineSnapshot | None] = {}

        def de_snapshot(eid: int) -> EngineSnapshot | None:
            if eid not in de_by_id:
                e = self.engines.get(eid)
                snap = None
                if e is not None and e.alive and e.address and e.role == Role.DECODE.value:
                    snap = self._snapshot(e, {})
                    des.append(snap)
                de_by_id[eid] = snap
            return de_by_id[eid]

        head = [f.rid for f in itertools.islice(self.pe_queue, _HEAD)]
        params = self.params
        while self.pe_queue:
            f = self.pe_queue[0]
            de = de_snapshot(f.de)
            if de is None:  # its DE died meanwhile
                self._requeue(f, "engine_dead")
                continue
            request = self._request(f)
            # Algorithm 1 for the head request (pe_fetch of one request, whose copies of the
            # group cost more than the pick): the PE, then its load as assigned, adopted
            # once the read side is settled
            chosen = pick_pe(pes, params.alpha, params.beta)
            if chosen is None:
                return
            pe_id = chosen.engine_id
            pe_class = classify_pe(chosen, params.alpha, params.beta).label
            pe = chosen.copy()
            pe.tok += request.length
            pe.seq += 1
            de_before = _snap_row(de)
            try:
                plan = read_plan(self.policy, request, pe, de, params, self._ordinal)
            except NoAvailableEngine:
                return  # seed-select found neither side healthy: wait for the next fetch
            pes_before = [_snap_row(e) for e in pes]
            self.pe_queue.popleft()
            chosen.tok, chosen.seq = pe.tok, pe.seq
            pe_q, de_q = pe.read_q, de.read_q
            pe_tokens = plan.pe_tokens if self.shaped else f.cached
            de_tokens = f.cached - pe_tokens
            for node, tokens in ((pe.node, pe_tokens), (de.node, de_tokens)):
                charge_read(pes, node, tokens)
                charge_read(des, node, tokens)
            self._ordinal += 1
            self._dispatch(f, pe_id, de.engine_id, pe_tokens)
            side = plan.side.value if plan.side is not None else "split"
            self._record(f, side, pe_q, de_q, pe_class, functools.partial(
                _pe_fetch_inputs, head, pes_before, de_before, {
                    "de_route": f.route, "de_place": f.place, "ordinal": self._ordinal - 1,
                    "alpha": params.alpha, "beta": params.beta,
                    "z_factor": params.z_factor, "quota_s": self.quota_s,
                    "read_side": self.read_side, "sources": self._sources_kept(),
                    # the operator's names of the chosen nodes, as they were (explain)
                    "pe_node_name": self.engines[pe_id].name,
                    "de_node_name": self.engines[de.engine_id].name},
                self.ledger.last_lookup(f.rid)))

    def _dispatch(self, f: Flight, pe: int, de: int, pe_tokens: int) -> None:
        whole = f.de != de  # the turn's DE is the one it was placed on: only the PE's part
        self._load_delta(f, -1, de=whole)
        f.pe, f.de, f.pe_tokens = pe, de, pe_tokens
        self._load_delta(f, 1, de=whole)
        self.ledger.dispatched(f.rid, len(f.req.tokens))
        pe_state, de_state = self.engines[pe], self.engines[de]
        seqs = {}
        for state, tokens in ((de_state, f.cached - pe_tokens), (pe_state, pe_tokens)):
            seq = seqs[state.engine_id] = state.next_seq
            state.next_seq += 1
            if tokens:
                state.charges.add(seq, tokens)
                f.charges.append((state.engine_id, seq))
        # the prompt after the hit (engines compute only those tokens; the hit's KV is
        # read) as one int32 frame and the keys as one frame of raw digests. One message:
        # the PE forwards the DE's part (the Decode) to it ahead of the turn's KV
        start = f.cached
        self._send(pe_state.address, Prefill(
            f.rid, f.att, seqs[pe], TokenArray(f.prompt.array[start:]), f.cached, f.keys,
            pe_tokens, de_state.address, self.layerwise, self.shaped, start, f.req.gen,
            seqs[de], f.req.stream))

    def _sources_kept(self) -> dict[str, str]:
        """The thresholds' sources as a decision keeps them: one copy, shared by every
        decision until they change (a copy a decision cost its allocation, and its free
        when the ring dropped the decision). Read only: the inputs copy it when built."""
        if self._sources_copy != self.sources:
            self._sources_copy = dict(self.sources)
        return self._sources_copy

    def _record(self, f: Flight, side: str, pe_q: int, de_q: int, pe_class: str,
                inputs: Callable[[], dict[str, Any]]) -> None:
        self.log.record(
            at=time.time(), rid=f.rid, attempt=f.att, agent=f.req.agent, turn=f.req.turn,
            length=len(f.req.tokens), gen=f.req.gen, cached=f.cached, pe=f.pe, de=f.de,
            de_group=f.de_group, side=side, pe_tokens=f.pe_tokens,
            de_tokens=f.cached - f.pe_tokens, pe_read_q=pe_q, de_read_q=de_q,
            pe_class=pe_class, de_class=f.place.get("de_class"), z=f.place.get("z"),
            inputs=inputs)

    def _drop_charges(self, f: Flight) -> None:
        for eid, seq in f.charges:
            e = self.engines.get(eid)
            if e is not None:
                e.charges.drop(seq)
        f.charges.clear()

    def _unqueue(self, f: Flight) -> None:
        """Tell ``f``'s engines to drop its attempt and take it out of every queue."""
        for eid in (f.pe, f.de):
            e = self.engines.get(eid)
            if e is not None and e.alive and e.address:
                self._send(e.address, Cancel(f.rid, f.att))
        self._drop_charges(f)
        if f in self.pe_queue:
            self.pe_queue.remove(f)
        for g, q in self.private.items():
            if f in q:
                q.remove(f)
                self._routed_tok[g] -= len(f.req.tokens)
                self._group_load_add(g, -len(f.req.tokens))

    def _requeue(self, f: Flight, reason: str, max_hit: int | None = None) -> None:
        self._unqueue(f)
        f.att += 1
        self._load_delta(f, -1)
        f.pe = f.de = f.de_group = -1
        f.prefilled = False
        f.route, f.place = None, {}
        if max_hit is not None:
            f.max_hit_blocks = max_hit
        self._lookup(f)
        self.queue.appendleft(f)
        self.requeued += 1
        self.registry.counter("dualpath_scheduler_requeued_turns_total", reason=reason).inc()
