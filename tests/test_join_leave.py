"""A node that leaves on purpose (``DELETE /api/v1/join/NAME``, a SIGTERMed node agent) is
``left``, not ``dead``: its turns are re-queued as for a death, but its engines are no longer
the cluster's, so ``dualpath status`` does not count them as unhealthy engines for ever (an
operator's walk read "2/3 engines healthy", exit 2, after a node left and joined again)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dualpath_cli.api.app import _status
from dualpath_cli.cluster.join import JoinService
from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.diagnose.model import Severity
from dualpath_cli.diagnose.workflows.membership import membership
from dualpath_cli.errors import UsageError
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.turns import Ticket, TurnRequest
from dualpath_cli.storage import MemoryStore
from dualpath_cli.telemetry.membership import Membership, NodeMember, RoleGap


@pytest.fixture()
def system(tmp_path: Path) -> Iterator[RuntimeSystem]:
    """A runtime with no engines of its own (nodes join it) over an in-memory store."""
    system = RuntimeSystem(RuntimeOptions(local_engines=False, store_dir=tmp_path / "store"),
                           MemoryStore())
    try:
        yield system
    finally:
        system.close()


def test_a_node_that_leaves_is_left_and_one_that_dies_is_dead(system: RuntimeSystem) -> None:
    joins = JoinService(system)
    gone = joins.join("p0", "prefill", 2)
    crashed = joins.join("d0", "decode", 1)
    kept = joins.join("d1", "decode", 1)
    assert joins.leave("p0") == 2
    system.scheduler.mark_dead(crashed.engine_ids[0])
    states = {eid: e.state for eid, e in system.scheduler.engines.items()}
    assert [states[e] for e in gone.engine_ids] == ["left", "left"]
    assert states[crashed.engine_ids[0]] == "dead"
    assert states[kept.engine_ids[0]] == "starting"
    assert set(joins.status("p0")["engines"].values()) == {"left"}
    # a silent engine whose node then leaves is left too
    system.scheduler.mark_dead(kept.engine_ids[0], "left")
    assert system.scheduler.engines[kept.engine_ids[0]].state == "left"


def test_status_counts_only_the_clusters_engines() -> None:
    view: Any = SimpleNamespace(
        state="ready", pd="1P2D", model="tiny", uptime_s=1.0, membership=None, nodes=[],
        engines=[SimpleNamespace(state=s) for s in ("ready", "ready", "left", "left", "dead")],
        scheduler=SimpleNamespace(
            policy="dualpath", fifo_length=0, private_queues={}, pe_queue_length=0,
            in_flight=0, decisions=SimpleNamespace(total=0),
            thresholds=SimpleNamespace(alpha_tokens=1, beta_tokens=1, z_factor=1.05,
                                       quota_s=0.3, read_side="dualpath", source={},
                                       controllers={})))
    system = SimpleNamespace(  # what the status reads of the runtime: units, scheduling
        opts=SimpleNamespace(snic_bw=0.0, nodes_per_group=1),
        scheduler=SimpleNamespace(sub_schedulers=lambda: ()),  # a flat one
        shape=SimpleNamespace(n_layers=2, bytes_per_token_layer=64, block_tokens=8),
        shaped=True, flops_rate=0.0, metric_frames=dict)  # no store trouble reported
    live: Any = SimpleNamespace(ready_s=1.0, audit=[], faults=lambda: [], system=system,
                                readiness=lambda: (True, "ready"))
    out = _status(live, view)
    assert out["engines"] == {"healthy": 2, "total": 3}


def test_a_node_removed_before_its_hello_is_not_waited_for(system: RuntimeSystem) -> None:
    """Issue 34 item 4: join then DELETE before the hello left the cluster "starting" for
    good; and a name that is no URL path segment could never be removed."""
    joins = JoinService(system)
    joins.join("plain", "decode", 1)
    assert not system.scheduler.all_hello()
    joins.leave("plain")
    assert system.scheduler.all_hello()
    members = system.view().membership
    assert members is not None
    assert [(n.name, n.state, n.said_hello) for n in members.nodes] == [
        ("plain", "left", False)]
    assert members.of == "0P0D"  # it never served: not configured
    assert "no decode engine since" in members.missing_line()
    for bad in ("a/b", "", "x" * 65, "-lead", "sp ace"):
        with pytest.raises(UsageError, match="node name"):
            joins.join(bad, "decode", 1)


def test_diagnose_membership_is_critical_for_a_missing_role() -> None:
    gap = RoleGap("decode", 1_000.0, "D0 left")
    members = Membership("1P0D", "1P1D", (NodeMember("P0", 0, "prefill", "serving", 1, 1),
                                          NodeMember("D0", 1, "decode", "left", 1, 0)),
                         (gap,))
    view: Any = SimpleNamespace(state="ready", pd="1P1D", membership=members)
    ev: Any = SimpleNamespace(samples=[SimpleNamespace(view=view)])
    (finding,) = membership(ev)
    assert finding.severity == Severity.CRITICAL
    assert finding.title.startswith("no decode engine since ")
    assert "(D0 left): 1P0D (of 1P1D) serve" in finding.title
    ok: Any = SimpleNamespace(samples=[SimpleNamespace(view=SimpleNamespace(
        state="ready", pd="1P1D", membership=Membership("1P1D", "1P1D")))])
    assert [f.severity for f in membership(ok)] == [Severity.OK]


def _decoding(system: RuntimeSystem, pe: int, de: int) -> Ticket:
    """A turn running on decode engine ``de`` (prefilled on ``pe``, decoding there), as a
    dispatch would leave it; its ticket."""
    sched = system.scheduler
    ticket = sched.submit(TurnRequest(0, 0, np.arange(1, 40, dtype=np.int64), 4))
    assert ticket.rid is not None
    with sched._lock:
        f = sched.flights[ticket.rid]
        sched.queue.remove(f)
        f.pe, f.de, f.de_group, f.prefilled = pe, de, sched.engines[de].group, True
        sched._load_delta(f, 1)
    return ticket


def _hello(system: RuntimeSystem, eids: list[int]) -> None:
    """The engines ``eids`` said hello (no process runs in this test)."""
    sched = system.scheduler
    with sched._lock:
        for eid in eids:
            sched.engines[eid].address = f"inproc://engine-{eid}"
        sched._live_version += 1
        sched._count_engines()


def test_a_leaving_node_drains_then_leaves(system: RuntimeSystem) -> None:
    """Issue 32: a node that leaves (DELETE /api/v1/join/NAME, its agent's Ctrl-C) is
    ``draining`` in the membership record, status and ``dualpath_engines{state}`` while it
    finishes its turns; no new turn goes to it; it is ``left`` once it holds none."""
    joins = JoinService(system)
    p0 = joins.join("P0", "prefill", 1).engine_ids
    d0 = joins.join("D0", "decode", 1).engine_ids
    d1 = joins.join("D1", "decode", 1).engine_ids
    _hello(system, p0 + d0 + d1)
    sched = system.scheduler
    ticket = _decoding(system, p0[0], d0[0])

    joins.leave("D0")
    assert sched.engines[d0[0]].state == "draining"
    assert joins.status("D0")["engines"] == {str(d0[0]): "draining"}
    members = system.view().membership
    assert members is not None
    assert {n.name: n.state for n in members.nodes} == {
        "P0": "serving", "D0": "draining", "D1": "serving"}
    assert not members.missing  # it still serves its turn: no role is missing
    gauge = sched.registry.gauge("dualpath_engines", role="decode", state="draining")
    assert gauge.value == 1
    with sched._lock:  # no new turn goes to it: only D1's group is offered work
        assert set(sched._live_members("decode")) == {sched.engines[d1[0]].group}
        sched._settle_drains()  # still busy: stays
    assert sched.engines[d0[0]].state == "draining"

    sched.cancel(ticket.rid)  # its turn is over
    with sched._lock:
        sched._settle_drains()
    assert sched.engines[d0[0]].state == "left"
    assert gauge.value == 0
    members = system.view().membership
    assert members is not None
    assert {n.name: n.state for n in members.nodes}["D0"] == "left"


def test_a_drain_is_bounded(system: RuntimeSystem) -> None:
    """A node whose turn outlasts the drain's bound is left anyway, the turn re-queued."""
    joins = JoinService(system)
    p0 = joins.join("P0", "prefill", 1).engine_ids
    d0 = joins.join("D0", "decode", 1).engine_ids
    _hello(system, p0 + d0)
    sched = system.scheduler
    ticket = _decoding(system, p0[0], d0[0])
    joins.leave("D0", drain_s=0.0)
    with sched._lock:
        sched._settle_drains()
    assert sched.engines[d0[0]].state == "left"
    assert list(sched.queue) == [sched.flights[ticket.rid]]  # re-queued, not lost
    assert not ticket.event.is_set()


def test_diagnose_membership_warns_of_a_node_that_left_while_its_role_serves() -> None:
    """Story 6 on a 1P2D: D1 leaves (Ctrl-C), D0 still serves: WARNING on node D1 (less
    capacity, by an operator's hand), not CRITICAL; once D1 joins again (a new index under
    the same name) nothing is left to report."""
    def judge(*nodes: NodeMember, state: str = "ready") -> list[Any]:
        members = Membership("1P1D", "1P2D", (NodeMember("P0", 0, "prefill", "serving", 1, 1),
                                              NodeMember("D0", 1, "decode", "serving", 1, 1),
                                              *nodes))
        view: Any = SimpleNamespace(state=state, pd="1P2D", membership=members)
        return membership(SimpleNamespace(samples=[SimpleNamespace(view=view)]))  # type: ignore[arg-type]

    left = NodeMember("D1", 2, "decode", "left", 1, 0)
    (finding,) = judge(left)
    assert (finding.severity, finding.subject) == (Severity.WARNING, "node D1")
    assert finding.title == "node D1 left: 1P1D (of 1P2D) serve"
    (draining,) = judge(NodeMember("D1", 2, "decode", "draining", 1, 1))
    assert draining.severity == Severity.WARNING and "leaving" in draining.title
    back = NodeMember("D1", 3, "decode", "serving", 1, 1)
    assert [f.severity for f in judge(left, back)] == [Severity.OK]
    assert [f.severity for f in judge(NodeMember("D1", 2, "decode", "draining", 1, 1),
                                      state="draining")] == [Severity.OK]


def test_a_node_that_joins_again_after_a_death_replaces_its_dead_engines(
        system: RuntimeSystem) -> None:
    """A node whose engine was killed joins again under its name (its agent restarts it):
    the dead engine is replaced (``left``), so status does not count it unhealthy for ever
    (the drill's kill_decode on joined nodes read "3/4 engines healthy")."""
    joins = JoinService(system)
    first = joins.join("D1", "decode", 1)
    system.scheduler.mark_dead(first.engine_ids[0])
    assert system.scheduler.engines[first.engine_ids[0]].state == "dead"
    again = joins.join("D1", "decode", 1)
    assert again.node != first.node
    assert system.scheduler.engines[first.engine_ids[0]].state == "left"
    members = system.view().membership
    assert members is not None
    assert [(n.name, n.state) for n in members.nodes] == [("D1", "left"), ("D1", "joining")]
    assert members.leaving() == ()  # it is back: nothing left to report
