"""Read-queue reports ride on the group leader's fetch (paper 6.1: only a group's leader
talks to the scheduler): the scheduler names each group's leader to its members, applies
the reports a fetch carries, and names an heir when the leader dies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until

from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.core.layout import BlockShape, Namespace
from dualpath_cli.core.policies import SchedParams
from dualpath_cli.runtime.kept_reports import KeptReports
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.scheduler import SchedulerService
from dualpath_cli.runtime.wire import (
    Fetch,
    GroupLeader,
    Hello,
    Lead,
    QueueReport,
    WireMessage,
    decode,
    encode,
)
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services.runner import run_agents
from dualpath_cli.storage import MemoryStore
from dualpath_cli.transfer import InProcFabric

_NS = Namespace("tiny", "layer_major", BlockShape(2, 8, 8))
_PARAMS = SchedParams(alpha=10**9, beta=10**9, z_factor=1.05, block_tokens=8)
#: engine -> (role, group): a PE group of three, a DE group of two
_ROLES = {0: ("prefill", 0), 1: ("prefill", 0), 2: ("prefill", 0),
          3: ("decode", 1), 4: ("decode", 1)}


class _Group:
    """Engines that said hello to a scheduler without its thread: each message is handled
    at once on this thread; what the scheduler sends each engine is read back."""

    def __init__(self, engines: dict[int, tuple[str, int]]) -> None:
        self.fabric = InProcFabric()
        self.sched = SchedulerService(self.fabric, MemoryStore(), _NS, "dualpath", _PARAMS,
                                      4096 * 8)
        self.eps: dict[int, Any] = {}
        for eid, (role, group) in engines.items():
            self.join(eid, role, group)

    def join(self, eid: int, role: str, group: int, register: bool = True) -> None:
        if register:
            self.sched.register(eid, role, group, group)
        self.eps[eid] = self.fabric.endpoint(f"engine{eid}-{len(self.eps)}")
        self.say(eid, Hello(eid, self.eps[eid].address, role, group, group, 0))

    def say(self, eid: int, msg: WireMessage) -> None:
        header, frames = encode(msg)
        self.eps[eid].send(self.sched.address, header, frames)
        raw = self.sched.ep.recv(timeout=5)
        assert raw is not None
        with self.sched._lock:
            self.sched._handle(raw)

    def fetch(self, eid: int, *reports: tuple[Any, ...]) -> None:
        role, group = _ROLES.get(eid, ("prefill", 0))
        self.say(eid, Fetch(eid, group, role, reports))

    def inbox(self, eid: int) -> list[WireMessage]:
        out = []
        while (raw := self.eps[eid].recv(timeout=0)) is not None:
            out.append(decode(raw.header, raw.buffers))
        return out


def test_a_leader_keeps_each_engines_newest_report_until_its_fetch() -> None:
    kept = KeptReports()
    kept.keep(1, 5, 3, 640)
    kept.keep(1, 4, 2, 999)  # older: overtaken
    kept.keep(2, 1, 0, 64)
    kept.keep(2, 2, 1, 0)  # newer: replaces
    assert sorted(kept.take()) == [(1, 5, 3, 640), (2, 2, 1, 0)]
    assert kept.take() == ()  # taken once


def test_the_first_fetch_names_the_leader_to_its_group_only() -> None:
    g = _Group(_ROLES)
    g.fetch(0)
    told = GroupLeader(0, g.eps[0].address)
    assert g.inbox(1) == [told] and g.inbox(2) == [told]
    assert g.inbox(0) == [] and g.inbox(3) == [] and g.inbox(4) == []
    g.fetch(0)  # named once, not on every fetch
    assert g.inbox(1) == [] and g.inbox(2) == []
    g.join(5, "prefill", 0)  # a member that says hello later is told at once
    assert g.inbox(5) == [told]


def test_a_fetch_carries_its_groups_reports_newest_first_wins() -> None:
    g = _Group(_ROLES)
    e1 = g.sched.engines[1]
    e1.charges.add(3, 100)
    e1.charges.add(5, 50)
    g.fetch(0, (1, 7, 4, 640), (0, 2, 1, 0))
    assert (e1.rq_n, e1.rq, e1.seen) == (7, 640, 4)
    assert e1.charges.total == 50  # dispatch 3 counted in the report's rq now; 5 not yet
    assert g.sched.engines[0].rq_n == 2
    g.fetch(0, (1, 6, 9, 1))  # an older report, overtaken: ignored
    assert (e1.rq_n, e1.rq, e1.seen) == (7, 640, 4) and e1.charges.total == 50
    assert g.sched.bad_messages == 0
    g.say(1, QueueReport(1, 8, 5, 0))  # sent directly (no leader named yet): still taken
    assert (e1.rq, e1.charges.total) == (0, 0)


def test_reports_of_another_group_or_malformed_are_dropped() -> None:
    g = _Group(_ROLES)
    before = {eid: (e.rq_n, e.rq, e.seen) for eid, e in g.sched.engines.items()}
    g.fetch(0, (3, 9, 9, 9),  # a DE's, in a PE group's fetch
            (99, 1, 1, 1),  # no such engine
            (1, 2),  # short
            (1, "x", 1, 1))  # not a number
    assert g.sched.bad_messages == 4
    assert {eid: (e.rq_n, e.rq, e.seen) for eid, e in g.sched.engines.items()} == before


def test_a_fetch_whose_reports_are_not_lists_is_refused_not_raised() -> None:
    g = _Group(_ROLES)
    g.eps[0].send(g.sched.address, {"t": "fetch", "eid": 0, "group": 0, "role": "prefill",
                                    "reports": 5}, [])
    raw = g.sched.ep.recv(timeout=5)
    assert raw is not None
    with g.sched._lock:
        g.sched._handle(raw)  # a WireError would have ended the service thread
    assert g.sched.bad_messages == 1
    g.fetch(0, (1, 2, 3, 4))  # the next fetch is read as usual
    assert g.sched.engines[1].rq == 4


def test_when_the_leader_dies_its_heir_is_named_to_the_group() -> None:
    g = _Group(_ROLES)
    g.fetch(0)
    g.inbox(1), g.inbox(2)
    with g.sched._lock:
        g.sched._dead(0, "exited")
    assert g.inbox(1) == [Lead(0)]  # the heir fetches from now on
    assert g.inbox(2) == [GroupLeader(0, g.eps[1].address)]
    g.fetch(1, (2, 3, 2, 64))  # the heir's fetch carries the member's report
    assert g.sched.engines[2].rq == 64
    assert g.inbox(2) == []  # already named


def test_a_leader_back_at_a_new_address_is_named_again() -> None:
    g = _Group(_ROLES)
    g.fetch(0)
    g.inbox(1), g.inbox(2)
    g.join(0, "prefill", 0, register=False)  # its process restarted: a new socket
    told = GroupLeader(0, g.eps[0].address)
    assert g.inbox(1) == [told] and g.inbox(2) == [told]


def _spy(system: RuntimeSystem) -> tuple[list[int], list[int]]:
    """Engine ids of the reports fetches carried and of those sent directly."""
    sched = system.scheduler
    assert isinstance(sched, SchedulerService)
    carried: list[int] = []
    direct: list[int] = []
    on_fetch, on_report = sched._group_reports, sched._handlers[QueueReport]

    def fetched(e: Any, reports: tuple[tuple[int, ...], ...]) -> None:
        carried.extend(r[0] for r in reports)
        on_fetch(e, reports)

    def reported(e: Any, msg: QueueReport, now: float) -> None:
        direct.append(msg.eid)
        on_report(e, msg, now)

    sched._group_reports = fetched  # type: ignore[method-assign]
    sched._handlers[QueueReport] = reported
    return carried, direct


def _settled(system: RuntimeSystem) -> bool:
    """Every engine's reported read queue is empty and no read charge is pending."""
    sched = system.scheduler
    assert isinstance(sched, SchedulerService)
    with sched._lock:
        return all(e.rq == 0 and not e.charges for e in sched.engines.values())


def _members(system: RuntimeSystem) -> set[int]:
    return {s.engine_id for s in system.specs if not s.leader}


def _members_report_through_their_leader(opts: RuntimeOptions, agents: int,
                                         turns: int) -> None:
    """Run the agents: a member's reports reach the scheduler on its leader's fetches
    (more of them than straight from members), and every read charge is retired once the
    turns are done."""
    with RuntimeSystem(opts) as system:
        carried, direct = _spy(system)
        result = run_agents(system, agentic_workload(agents, turns=turns), timeout=60)
        assert not result.errors and len(result.turns) == agents * turns
        wait_until(lambda: _settled(system), 10, "the read charges to be retired")
        members = _members(system)
    assert members & set(carried)  # a member's report rode on its leader's fetch
    assert len([e for e in direct if e in members]) < len([e for e in carried if e in members])


def test_real_engines_members_report_through_their_leader() -> None:
    """Threads over queues, two engines a node."""
    _members_report_through_their_leader(
        RuntimeOptions(block_tokens=8, gpus_per_node=2, fetch_s=0.01), 4, 3)


@pytest.mark.e2e
def test_emulated_engines_members_report_through_their_leader(tmp_path: Path) -> None:
    """Emulated engines, four a node over two host processes."""
    _members_report_through_their_leader(
        RuntimeOptions(prefill_nodes=1, decode_nodes=2, gpus_per_node=4, engines="emulated",
                       emulated_model="ds27b", emulated_hosts=2, emulated_speed=20.0,
                       store_dir=tmp_path, heartbeat_s=0.2, fetch_s=0.01), 6, 4)


@pytest.mark.e2e
def test_after_the_leaders_death_members_report_through_its_heir(tmp_path: Path) -> None:
    """Engine processes, three a node: the prefill node's leader is killed between two
    runs; the heir fetches, the other member's reports reach the scheduler on the heir's
    fetches, and every read charge is retired again. Every read is on the PE side
    (``layerwise``), so any cached turn placed on the member is a read on it (with
    ``round-robin`` the read side alternated by decision ordinal, and the member's turns
    could all land on the DE side)."""
    opts = RuntimeOptions(policy="layerwise", block_tokens=8, processes=True,
                          gpus_per_node=3, store_dir=tmp_path / "store", fetch_s=0.01,
                          heartbeat_timeout=3600.0,  # deaths seen through the exit
                          restart=False)  # the leader stays dead: its heir leads
    with RuntimeSystem(opts) as system:
        sched = system.scheduler
        assert isinstance(sched, SchedulerService)
        first = run_agents(system, agentic_workload(4, turns=2), timeout=60)
        assert not first.errors
        pes = [s for s in system.specs if s.role == "prefill"]
        leader = next(s.engine_id for s in pes if s.leader)
        heir, member = sorted(s.engine_id for s in pes if s.engine_id != leader)
        system.cluster.kill(leader)  # type: ignore[union-attr]
        wait_until(lambda: sched._report_to.get(("prefill", pes[0].group)) == heir, 30,
                   "the heir to be named")
        since = sched.log.last_seq or 0
        carried, _ = _spy(system)
        second = run_agents(system, agentic_workload(6, turns=3), timeout=90)
        assert not second.errors and len(second.turns) == 18
        wait_until(lambda: _settled(system), 10, "the read charges to be retired")
        read_on_member = [d for d in system.decisions() if d.seq > since and d.kind == "turn"
                          and d.pe == member and d.pe_tokens > 0]
    assert heir in carried  # the heir carries its own reports now
    assert read_on_member, "no turn read on the member after the death"
    assert member in carried  # and the member's, sent to it
